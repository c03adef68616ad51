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
--   range scans, one per priority band -- above 0, exactly 0 (written as the
--   range `priority >= 0 AND priority <= 0`: docs/SQL.md, 0025), below 0 -- in
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
--   The pick always takes FOR UPDATE SKIP LOCKED, so the claim passes over
--   a row another transaction holds locked and never waits for it: a replica
--   claiming right now, an operator's cancel or reschedule, an application's
--   SELECT ... FOR UPDATE, a producer's open transaction.  The claim is not
--   the only writer of pending rows, and one that waited on one locked row
--   would stall every stage until lock_timeout.  A skipped row is taken by a
--   later claim once its lock is gone.  Only rows the LIMIT lets through are
--   locked.  skip_locked is accepted for the callers of earlier revisions and
--   changes nothing.
--   Raises 22004 for a NULL dispatcher_id, 22023 when stages and caps (or a
--   non-NULL after_ids) differ in length.
--   Writes: pepsi.workqueue (status, dispatcher_id, updated_at).
--   Locks: the claimed rows.
--   Guarantees: a row is returned to at most one caller: the pick holds each
--   row's lock, and the UPDATE re-checks status = 'pending'.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
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
SET enable_sort = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT c.workqueue_id, c.stage, c.priority
      FROM pepsi.claim_lines(claim.dispatcher_id, claim.stages, claim.caps,
                             claim.skip_locked, claim.after_ids, NULL) AS c;
END
$$;
