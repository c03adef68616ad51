-- pepsi.claim(dispatcher_id bigint, stages text[], caps int[],
--             skip_locked boolean default false, after_ids bigint[] default NULL)
--   → table(workqueue_id bigint, stage text)
--   Moves up to caps[i] pending rows of stages[i] to 'running' (held by
--   dispatcher_id), lowest workqueue_id first, for every stage at once, in
--   ONE UPDATE … RETURNING.  Stages with cap <= 0 or NULL claim nothing.
--   Rows come back ordered by stage, then workqueue_id.
--   The pick is a per-stage LATERAL … ORDER BY workqueue_id LIMIT cap over
--   the partial index workqueue_pending_idx (ordered by stage, workqueue_id,
--   the index's own order), evaluated once into an array
--   (an uncorrelated ARRAY(...) sub-select is an InitPlan: it runs exactly
--   once, so the LIMIT cannot be re-applied as in PostgreSQL bug #15715);
--   the UPDATE then finds the rows by `workqueue_id = ANY(array)`, a primary
--   key index scan.
--   after_ids (v4): when not NULL, aligned with stages; stage i picks only
--   rows with workqueue_id > after_ids[i] (a NULL entry: no bound).  The
--   bound is an index condition, so the scan STARTS there instead of walking
--   the stage's low end.  The caller must know no pending row of the stage
--   lies at or below the bound (see docs/INTERNALS.md, "Claim floors").
--   skip_locked (competing mode): the pick takes FOR UPDATE SKIP LOCKED, so
--   replicas pass over rows another replica is claiming right now.
--   Raises 22004 for a NULL dispatcher_id, 22023 when stages and caps (or a
--   non-NULL after_ids) differ in length.
--   Writes: pepsi.workqueue (status, dispatcher_id, updated_at).
--   Locks: the claimed rows.
--   Guarantees: a row is returned to at most one caller — the UPDATE
--   re-checks status = 'pending' after waiting for any concurrent claimer.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
--
-- Why v2 (migration 0002): v1 joined the UPDATE to a MATERIALIZED CTE of
-- the picked ids.  The planner cannot see that the per-stage LIMIT keeps
-- the pick small (it guesses 10% of the stage's pending rows for a LIMIT
-- taken from a column), so with a backlog it hash-joins the CTE against a
-- sequential scan of the table.  Measured on 1,000,000 rows (460,000
-- pending over 8 stages, 100,000 paused, the rest done), claiming 8 stages
-- x 16 rows, PostgreSQL 15, 2 vCPU:
--     v1  Hash Join over Seq Scan on workqueue   ~140 ms per claim
--     v2  Index Scan using workqueue_pkey         ~1 ms per claim
-- With a small backlog both plans are nested loops; v2 is the same there.
--
-- Why v3 (migration 0005): two plans v2 left to the statistics.
--   1. The per-stage pick ordered by workqueue_id alone, which the primary
--      key also provides; for a stage with no pending rows the planner could
--      walk the primary key filtering every row of the table.  Ordering by
--      (stage, workqueue_id) is the partial index's order, which no other
--      index gives, so the pick always walks workqueue_pending_idx.
--   2. The UPDATE's re-check `status = 'pending'` matches the partial
--      index's predicate; with statistics older than a bulk enqueue the
--      planner scanned the whole pending index filtering by the id array.
--      `(status = 'pending') IS TRUE` is the same test (status is NOT NULL)
--      but proves nothing about the index predicate, so the update finds the
--      rows through the primary key.
--   Measured (PostgreSQL 15, 2 vCPU): 20,000 pending rows enqueued into a
--   table whose statistics were taken empty, 3 stages x 64:
--       v2  Index Scan using workqueue_pending_idx (5,003 buffers)  ~14 ms
--       v3  Bitmap Index Scan on workqueue_pkey (≈70 buffers)        ~0.8 ms
--   and after ANALYZE both ~0.8 ms.
--
-- Why v4 (migration 0007): after a burst of claims the partial pending index
-- still holds the entries of every claimed row until VACUUM (measured: the
-- next scans do not kill them fast enough under a dispatcher's load), and
-- each claim's per-stage pick walks them from the low end.  With a 100,000-message backlog the pick of 256 rows touched ~11,000
-- buffers (3 ms).  The dispatcher knows where its last claim of a stage
-- ended (its "claim floor": nothing of that stage is pending at or below
-- it) and passes it as after_ids[i]; `q.workqueue_id > coalesce(after_id, 0)`
-- is an index condition of the pick, so the scan starts at the floor.
-- The signature changes, so 0007 drops the 4-argument function (grants
-- re-applied); callers passing 3 or 4 arguments are unchanged.
--   Measured (PostgreSQL 15.20, 2 vCPU, embedded cluster, bench --worker raw
--   --parallelism 2, latency 0):
--                                                          v3            v4
--     1 stage, QUEUE_LIMIT 256, 100,000 messages    12,260 msg/s  36,766 / 37,660 msg/s
--     1 stage, QUEUE_LIMIT 256, 40,000 messages x3  16,343 msg/s  33,920 msg/s (medians)
--     3 stages, QUEUE_LIMIT 64, 20,000 messages      4,852 msg/s   8,813 msg/s
--   and the pick alone, 100,000 pending, after 25,600 claimed in 256-row
--   claims (another session holding a snapshot / none):
--     v3 (no bound)        405 buffers 1.5 ms  /  210 buffers 0.19 ms
--     v4 after_id = floor   11 buffers 0.07 ms /    8 buffers 0.06 ms
CREATE OR REPLACE FUNCTION pepsi.claim(dispatcher_id bigint, stages text[], caps integer[],
                                       skip_locked boolean DEFAULT false,
                                       after_ids bigint[] DEFAULT NULL)
RETURNS TABLE (workqueue_id bigint, stage text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
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
                              SELECT q.workqueue_id
                                FROM pepsi.workqueue AS q
                               WHERE q.stage = s.stage AND q.status = 'pending'
                                 AND q.workqueue_id > coalesce(s.after_id, 0)
                               ORDER BY q.stage, q.workqueue_id
                               LIMIT s.cap
                                 FOR UPDATE SKIP LOCKED) AS p
                        WHERE s.cap > 0))
               AND (w.status = 'pending') IS TRUE
            RETURNING w.workqueue_id, w.stage
        )
        SELECT m.workqueue_id, m.stage FROM moved AS m ORDER BY m.stage, m.workqueue_id;
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
                              SELECT q.workqueue_id
                                FROM pepsi.workqueue AS q
                               WHERE q.stage = s.stage AND q.status = 'pending'
                                 AND q.workqueue_id > coalesce(s.after_id, 0)
                               ORDER BY q.stage, q.workqueue_id
                               LIMIT s.cap) AS p
                        WHERE s.cap > 0))
               AND (w.status = 'pending') IS TRUE
            RETURNING w.workqueue_id, w.stage
        )
        SELECT m.workqueue_id, m.stage FROM moved AS m ORDER BY m.stage, m.workqueue_id;
    END IF;
END
$$;
