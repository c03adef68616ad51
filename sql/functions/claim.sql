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
--   range `priority >= 0 AND priority <= 0`, see v8), below 0 -- in
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
--
-- Why v8 (migration 0025): the priority-0 band walked the primary key.  With
--   `priority = 0` both the stage and the priority are constants of the
--   band's scan, so its ORDER BY reduces to workqueue_id: the primary key
--   serves that order too, as a range scan from the floor that filters on
--   stage, status and priority.  A generic plan guesses a stage's share of
--   the table as 1/(number of stages), so when the statistics were taken
--   while one stage held the backlog (a pipeline whose first stage is behind,
--   the usual case), the plan chose that walk for every stage: the claim of
--   the other stages read past every row of the busy one.  Measured: 200,000
--   pending rows in stage a, 40 in b and c, a claim of 4 per stage read 6,214
--   buffers and filtered 146,669 rows, 90-160 ms per claim.  The band is now
--   the range `priority >= 0 AND priority <= 0`: the same index range
--   (stage, 0, floor) of workqueue_pending_idx, started at the floor (both
--   bounds are inclusive, so the scan is positioned on the id as before), but
--   the priority is no longer a constant, so the order (priority DESC,
--   workqueue_id) is one only the pending index gives without a sort.  The
--   function also sets enable_sort off, so a plan made on statistics that
--   say "tiny table" cannot choose the primary key with a sort either: 12
--   buffers, ~2.5 ms per claim, in the same case.  The claim's own final
--   ORDER BY still sorts (there is no other way), so its plan carries the
--   disabled sort's cost, far above jit_above_cost: the function sets jit
--   off, or each call would be compiled by LLVM (~300 ms).
--
-- Why v9 (migration 0026): one body for the claim.  The dispatcher claims with
--   pepsi.claim_lines, which returns each row as a worker's line too; claim
--   is now that function without lines (line_limits NULL renders nothing),
--   so the pick written out above lives in claim_lines.sql alone.  Same
--   signature, result and settings as v8.
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
