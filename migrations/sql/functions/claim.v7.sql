-- pepsi.claim(dispatcher_id bigint, stages text[], caps int[],
--             skip_locked boolean default false, after_ids bigint[] default NULL)
--   → table(workqueue_id bigint, stage text, priority integer)
--   Moves up to caps[i] pending rows of stages[i] to 'running' (held by
--   dispatcher_id), highest priority first and, within a priority, lowest
--   workqueue_id first, for every stage at once, in ONE UPDATE … RETURNING.
--   Stages with cap <= 0 or NULL claim nothing.  Rows come back ordered by
--   stage, then priority (highest first), then workqueue_id.
--   The pick is a per-stage LATERAL over the partial index
--   workqueue_pending_idx (stage, priority DESC, workqueue_id): three index
--   range scans, one per priority band -- above 0, exactly 0, below 0 -- in
--   that order under one LIMIT cap (an Append runs its branches in order and
--   the LIMIT stops it as soon as cap rows came, so a stage whose positive
--   band is empty pays one index descent for it), evaluated once into an
--   array (an uncorrelated ARRAY(...) sub-select is an InitPlan: it runs
--   exactly once, so the LIMIT cannot be re-applied as in PostgreSQL bug
--   #15715); the UPDATE then finds the rows by `workqueue_id = ANY(array)`,
--   a primary key index scan.
--   after_ids: when not NULL, aligned with stages; stage i picks only rows of
--   priority 0 with workqueue_id > after_ids[i] (a NULL entry: no bound).
--   In the priority-0 band the bound is part of the index range (stage, 0,
--   after_id), so the scan STARTS there instead of walking the dead entries
--   claimed rows leave at the band's low end.  The caller must know no
--   pending row of priority 0 of the stage lies at or below the bound (see
--   docs/INTERNALS.md, "Claim floors"): a floor may be raised only by the
--   ids of priority-0 rows a claim returned, hence the priority column.
--   Rows of other priorities are never bounded.
--   skip_locked (competing mode): the pick takes FOR UPDATE SKIP LOCKED, so
--   replicas pass over rows another replica is claiming right now.  Only
--   rows the LIMIT lets through are locked.
--   Raises 22004 for a NULL dispatcher_id, 22023 when stages and caps (or a
--   non-NULL after_ids) differ in length.
--   Writes: pepsi.workqueue (status, dispatcher_id, updated_at).
--   Locks: the claimed rows.
--   Guarantees: a row is returned to at most one caller — the UPDATE
--   re-checks status = 'pending' after waiting for any concurrent claimer.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
--
-- History: v2 (0002) found the rows through the primary key instead of a
-- hash join; v3 (0005) ordered the pick by the partial index's own order and
-- made the UPDATE's re-check `(status = 'pending') IS TRUE` so it never scans
-- the pending index; v4 (0007) added after_ids (claim floors).  See those
-- files for the measurements.
--
-- Why v5 (migration 0019): priorities.  The pick's order is the new index
-- order (stage, priority DESC, workqueue_id).  A single range scan ordered
-- that way could not start at a floor (the floor is an id, the index's third
-- column), so the pick is split into the three bands; with every priority 0
-- the plan is v4's (one range scan from (stage, 0, floor)) plus an empty
-- descent into the positive band.  The result gains the priority column
-- (the signature's result changes, so 0019 drops v4 and grants again).
--
-- Why v6 (migration 0023): the plan.  PL/pgSQL caches a statement's plan,
--   but a statement with array parameters was planned again on every call:
--   the plan cache compares the plan made for the call's own arrays with a
--   generic one, and the generic plan's guess at an array's length always
--   priced it higher, so it kept making custom plans.  Planning was about a
--   third of the server's CPU at the shipped stage defaults (perf, a
--   one-stage SDK drain at PARALLELISM 4 x QUEUE_LIMIT 4).  The plan is the
--   same for any arrays (index range scans of workqueue_pending_idx per
--   stage, then workqueue_pkey for the UPDATE), so the function
--   now sets plan_cache_mode = force_generic_plan: planned once per session.
--
-- Why v7 (migration 0024): plans that hold however the table grows.  With
--   force_generic_plan the plan is made once per session, at the first call,
--   from the statistics of that moment.  A dispatcher or worker that starts
--   on an empty queue (the usual start) made it for an empty table: a
--   sequential scan, kept for the session's life while the table grew, until
--   an ANALYZE invalidated it (never, where autovacuum is off).  Measured: 850
--   instead of ~150 us of PostgreSQL CPU per message at the shipped stage
--   defaults.  The function now also sets enable_seqscan, enable_hashjoin and
--   enable_mergejoin off, so its plan is index scans and nested loops (the
--   plan v6 gets from fresh statistics) whatever the statistics say.
CREATE OR REPLACE FUNCTION pepsi.claim(dispatcher_id bigint, stages text[], caps integer[],
                                       skip_locked boolean DEFAULT false,
                                       after_ids bigint[] DEFAULT NULL)
RETURNS TABLE (workqueue_id bigint, stage text, priority integer)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
BEGIN
    IF claim.dispatcher_id IS NULL THEN
        RAISE EXCEPTION 'claim needs a dispatcher_id' USING ERRCODE = '22004';
    END IF;
    IF cardinality(claim.stages) IS DISTINCT FROM cardinality(claim.caps) THEN
        RAISE EXCEPTION 'stages and caps differ in length (% vs %)',
                        cardinality(claim.stages), cardinality(claim.caps)
            USING ERRCODE = '22023';
    END IF;
    IF claim.after_ids IS NOT NULL
       AND cardinality(claim.after_ids) IS DISTINCT FROM cardinality(claim.stages) THEN
        RAISE EXCEPTION 'stages and after_ids differ in length (% vs %)',
                        cardinality(claim.stages), cardinality(claim.after_ids)
            USING ERRCODE = '22023';
    END IF;
    IF claim.skip_locked THEN
        RETURN QUERY
        WITH moved AS (
            UPDATE pepsi.workqueue AS w
               SET status = 'running', dispatcher_id = claim.dispatcher_id, updated_at = now()
             WHERE w.workqueue_id = ANY (ARRAY(
                       SELECT p.workqueue_id
                         FROM unnest(claim.stages, claim.caps, coalesce(claim.after_ids,
                                  array_fill(NULL::bigint, ARRAY[coalesce(cardinality(claim.stages), 0)])))
                              AS s(stage, cap, after_id)
                        CROSS JOIN LATERAL (
                              SELECT b.workqueue_id
                                FROM ((SELECT x.workqueue_id FROM (
                                           SELECT q.workqueue_id
                                             FROM pepsi.workqueue AS q
                                            WHERE q.stage = s.stage AND q.status = 'pending'
                                             AND q.priority > 0
                                           ORDER BY q.stage, q.priority DESC, q.workqueue_id
                                           LIMIT s.cap
                                           FOR UPDATE SKIP LOCKED) AS x)
                                      UNION ALL
                                      (SELECT x.workqueue_id FROM (
                                           SELECT q.workqueue_id
                                             FROM pepsi.workqueue AS q
                                            WHERE q.stage = s.stage AND q.status = 'pending'
                                             AND q.priority = 0
                                             AND q.workqueue_id > coalesce(s.after_id, 0)
                                           ORDER BY q.stage, q.priority DESC, q.workqueue_id
                                           LIMIT s.cap
                                           FOR UPDATE SKIP LOCKED) AS x)
                                      UNION ALL
                                      (SELECT x.workqueue_id FROM (
                                           SELECT q.workqueue_id
                                             FROM pepsi.workqueue AS q
                                            WHERE q.stage = s.stage AND q.status = 'pending'
                                             AND q.priority < 0
                                           ORDER BY q.stage, q.priority DESC, q.workqueue_id
                                           LIMIT s.cap
                                           FOR UPDATE SKIP LOCKED) AS x)) AS b
                               LIMIT s.cap) AS p
                        WHERE s.cap > 0))
               AND (w.status = 'pending') IS TRUE
            RETURNING w.workqueue_id, w.stage, w.priority
        )
        SELECT m.workqueue_id, m.stage, m.priority FROM moved AS m
         ORDER BY m.stage, m.priority DESC, m.workqueue_id;
    ELSE
        RETURN QUERY
        WITH moved AS (
            UPDATE pepsi.workqueue AS w
               SET status = 'running', dispatcher_id = claim.dispatcher_id, updated_at = now()
             WHERE w.workqueue_id = ANY (ARRAY(
                       SELECT p.workqueue_id
                         FROM unnest(claim.stages, claim.caps, coalesce(claim.after_ids,
                                  array_fill(NULL::bigint, ARRAY[coalesce(cardinality(claim.stages), 0)])))
                              AS s(stage, cap, after_id)
                        CROSS JOIN LATERAL (
                              SELECT b.workqueue_id
                                FROM ((SELECT q.workqueue_id
                                         FROM pepsi.workqueue AS q
                                        WHERE q.stage = s.stage AND q.status = 'pending'
                                          AND q.priority > 0
                                        ORDER BY q.stage, q.priority DESC, q.workqueue_id
                                        LIMIT s.cap)
                                      UNION ALL
                                      (SELECT q.workqueue_id
                                         FROM pepsi.workqueue AS q
                                        WHERE q.stage = s.stage AND q.status = 'pending'
                                          AND q.priority = 0
                                          AND q.workqueue_id > coalesce(s.after_id, 0)
                                        ORDER BY q.stage, q.priority DESC, q.workqueue_id
                                        LIMIT s.cap)
                                      UNION ALL
                                      (SELECT q.workqueue_id
                                         FROM pepsi.workqueue AS q
                                        WHERE q.stage = s.stage AND q.status = 'pending'
                                          AND q.priority < 0
                                        ORDER BY q.stage, q.priority DESC, q.workqueue_id
                                        LIMIT s.cap)) AS b
                               LIMIT s.cap) AS p
                        WHERE s.cap > 0))
               AND (w.status = 'pending') IS TRUE
            RETURNING w.workqueue_id, w.stage, w.priority
        )
        SELECT m.workqueue_id, m.stage, m.priority FROM moved AS m
         ORDER BY m.stage, m.priority DESC, m.workqueue_id;
    END IF;
END
$$;
