-- pepsi.requeue_due(stages text[], max_retries int[], default_max_retries int,
--                   expiry interval)
--   → table(requeued int, exhausted int, expired int, next_due timestamptz,
--           exhausted_stages text[], exhausted_counts int[],
--           expired_stages text[], expired_counts int[])
--   v2: also the exhausted and expired counts per stage (aligned arrays, stages
--   sorted, only stages with a non-zero count; empty arrays when none), so the
--   dispatcher can count rows failed with 'retries exhausted' in stage_stats.failed.
--   The retry policy, for paused rows whose timeout has come (timeout <= now()),
--   earliest first, at most 10,000 per call:
--     created_at < now() - expiry               → 'expired'  (dispatch_error 'expired')
--     retries >= max retries of its stage       → 'failed'   (dispatch_error 'retries exhausted')
--     otherwise                                 → 'pending', retries + 1, timeout NULL
--   The max retries of a stage is max_retries[i] for stages[i], else
--   default_max_retries (NULL: no cap).  expiry NULL: nothing expires.
--   next_due is the earliest timeout of the rows still paused afterwards
--   (NULL if none; <= now() when more than 10,000 were due: call again).
--   Writes: pepsi.workqueue.  Reads: workqueue_paused_idx.
--   Locks: the due rows (FOR UPDATE SKIP LOCKED, so competing replicas split
--   the work instead of queueing behind each other).
--   Guarantees: only rows still 'paused' are changed (re-checked in the UPDATE).
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
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
               (requeue_due.expiry IS NOT NULL
                AND w.created_at < now() - requeue_due.expiry) AS is_expired,
               (w.retries >= coalesce(
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
               retries = CASE WHEN due.is_expired OR due.is_exhausted THEN w.retries
                              ELSE w.retries + 1 END,
               state = CASE WHEN due.is_expired
                                 THEN w.state || '{"dispatch_error": "expired"}'
                            WHEN due.is_exhausted
                                 THEN w.state || '{"dispatch_error": "retries exhausted"}'
                            ELSE w.state END,
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
    SELECT min(w.timeout) INTO next_due
      FROM pepsi.workqueue AS w
     WHERE w.status = 'paused';
    RETURN NEXT;
END
$$;
