-- pepsi.requeue_due(stages text[], max_retries int[], default_max_retries int,
--                   expiry interval)
--   → table(requeued int, exhausted int, expired int, next_due timestamptz,
--           exhausted_stages text[], exhausted_counts int[],
--           expired_stages text[], expired_counts int[])
--   The paused→pending flip with the retry policy, for paused rows whose
--   timeout has come (timeout <= now()), earliest first, at most 10,000 per call:
--     delayed (enqueued with a future not_before, state ? 'delayed_until')
--                                               → 'pending', retries unchanged, the
--                                                 mark removed (a delay is not a
--                                                 retry; no expiry)
--     created_at < now() - expiry               → 'expired'  (dispatch_error 'expired')
--     retries >= max retries of its stage       → 'failed'   (dispatch_error 'retries exhausted')
--     otherwise                                 → 'pending', retries + 1, timeout NULL
--   The max retries of a stage is max_retries[i] for stages[i], else
--   default_max_retries (NULL: no cap).  expiry NULL: nothing expires.
--   requeued counts every row made pending, delayed ones included.
--   Exhausted and expired counts also per stage (aligned arrays, stages
--   sorted, only stages with a non-zero count; empty arrays when none).
--   next_due is the earliest finite timeout of the rows still paused
--   afterwards (NULL if none; <= now() when more than 10,000 were due: call
--   again).  A row paused until 'infinity' (possible before pause v3) is never
--   due and never makes next_due infinite.
--   Writes: pepsi.workqueue.  Reads: workqueue_paused_idx.
--   Locks: the due rows (FOR UPDATE SKIP LOCKED, so competing replicas split
--   the work instead of queueing behind each other).
--   Guarantees: only rows still 'paused' are changed (re-checked in the UPDATE).
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
--
-- Why v3 (migration 0009):
--   * v2 returned next_due = 'infinity' when the earliest paused row was
--     paused until 'infinity' (pause v1/v2 accepted it); the dispatcher's
--     `next_due - statement_timestamp()` then raised "cannot subtract
--     infinite timestamps" in the pipeline that also claims, so no stage was
--     served any more.  next_due now skips non-finite timeouts
--     (`timeout < 'infinity'` keeps the ordered scan of workqueue_paused_idx).
--   * delayed messages (enqueue v2's not_before): flipped without counting a
--     retry, so a delay never uses up MAX_RETRIES, and never expired (EXPIRY
--     bounds how long a message may be retried, not how far ahead it may be
--     scheduled).  The mark is removed in the same UPDATE.
CREATE OR REPLACE FUNCTION pepsi.requeue_due(stages text[], max_retries integer[],
                                             default_max_retries integer, expiry interval)
RETURNS TABLE (requeued integer, exhausted integer, expired integer, next_due timestamptz,
               exhausted_stages text[], exhausted_counts integer[],
               expired_stages text[], expired_counts integer[])
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    WITH due AS MATERIALIZED (
        SELECT w.workqueue_id,
               (w.state ? 'delayed_until') AS is_delayed,
               (NOT (w.state ? 'delayed_until')
                AND requeue_due.expiry IS NOT NULL
                AND w.created_at < now() - requeue_due.expiry) AS is_expired,
               (NOT (w.state ? 'delayed_until')
                AND w.retries >= coalesce(
                   (SELECT m.cap FROM unnest(requeue_due.stages, requeue_due.max_retries)
                                      AS m(stage, cap)
                     WHERE m.stage = w.stage LIMIT 1),
                   requeue_due.default_max_retries)) IS TRUE AS is_exhausted
          FROM pepsi.workqueue AS w
         WHERE w.status = 'paused' AND w.timeout <= now()
         ORDER BY w.timeout
         LIMIT 10000
           FOR UPDATE OF w SKIP LOCKED
    ), moved AS (
        UPDATE pepsi.workqueue AS w
           SET status = CASE WHEN due.is_expired THEN 'expired'
                             WHEN due.is_exhausted THEN 'failed'
                             ELSE 'pending' END,
               retries = CASE WHEN due.is_expired OR due.is_exhausted OR due.is_delayed
                                   THEN w.retries
                              ELSE w.retries + 1 END,
               state = CASE WHEN due.is_expired
                                 THEN w.state || '{"dispatch_error": "expired"}'
                            WHEN due.is_exhausted
                                 THEN w.state || '{"dispatch_error": "retries exhausted"}'
                            ELSE w.state - 'delayed_until' END,
               timeout = NULL,
               updated_at = now()
          FROM due
         WHERE w.workqueue_id = due.workqueue_id AND w.status = 'paused'
        RETURNING w.status AS new_status, w.stage
    ), per_stage AS (
        SELECT moved.new_status, moved.stage, count(*)::integer AS n
          FROM moved
         GROUP BY moved.new_status, moved.stage
    )
    SELECT coalesce(sum(p.n) FILTER (WHERE p.new_status = 'pending'), 0)::integer,
           coalesce(sum(p.n) FILTER (WHERE p.new_status = 'failed'), 0)::integer,
           coalesce(sum(p.n) FILTER (WHERE p.new_status = 'expired'), 0)::integer,
           coalesce(array_agg(p.stage ORDER BY p.stage)
                        FILTER (WHERE p.new_status = 'failed'), '{}'),
           coalesce(array_agg(p.n ORDER BY p.stage)
                        FILTER (WHERE p.new_status = 'failed'), '{}'),
           coalesce(array_agg(p.stage ORDER BY p.stage)
                        FILTER (WHERE p.new_status = 'expired'), '{}'),
           coalesce(array_agg(p.n ORDER BY p.stage)
                        FILTER (WHERE p.new_status = 'expired'), '{}')
      INTO requeued, exhausted, expired,
           exhausted_stages, exhausted_counts, expired_stages, expired_counts
      FROM per_stage AS p;

    -- A new statement, so a new snapshot: the rows just moved are not paused.
    -- Finite timeouts only: a row paused until 'infinity' is never due.
    SELECT min(w.timeout) INTO next_due
      FROM pepsi.workqueue AS w
     WHERE w.status = 'paused' AND w.timeout < 'infinity'::timestamptz;
    RETURN NEXT;
END
$$;
