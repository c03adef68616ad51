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
--   A row made pending loses state.pause_reason (it is no longer paused; the
--   reason stays in its history, pepsi.attempts), so a message that later
--   ends done carries no stale pause reason.
--   The max retries of a stage (pepsi._retry_cap): with stages NULL -- what
--   the dispatcher passes -- the stage registry's (pepsi.stages.max_retries,
--   the same source record_dispatch_error reads), else default_max_retries,
--   else 10; with stages given, max_retries[i] for stages[i], else
--   default_max_retries (NULL: no cap).  expiry NULL: nothing expires.
--   requeued counts every row made pending, delayed ones included.
--   Exhausted and expired counts also per stage (aligned arrays, stages
--   sorted, only stages with a non-zero count; empty arrays when none).
--   next_due is the earliest finite timeout of the rows still paused
--   afterwards (NULL if none; <= now() when more than 10,000 were due: call
--   again).  A row paused until 'infinity' (possible before pause v3) is never
--   due and never makes next_due infinite.
--   Writes: pepsi.workqueue.  Reads: workqueue_paused_idx, pepsi.stages (by key).
--   Locks: the due rows (FOR UPDATE SKIP LOCKED, so competing replicas split
--   the work instead of queueing behind each other).
--   A due row whose state cannot take its note (near the jsonb size limit,
--   255 MB: `state || ...` raises 54000) still becomes 'expired'/'failed',
--   its state untouched, and a WARNING names its id and the error.
--   Guarantees: only rows still 'paused' are changed (re-checked in the UPDATE).
--   Nothing is lost (payload and state stay), and one such row never stops
--   the other due rows from moving.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.requeue_due(stages text[], max_retries integer[],
                                             default_max_retries integer, expiry interval)
RETURNS TABLE (requeued integer, exhausted integer, expired integer, next_due timestamptz,
               exhausted_stages text[], exhausted_counts integer[],
               expired_stages text[], expired_counts integer[])
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    bare bigint[] := '{}';  -- rows whose state stays as it is
    r record;
BEGIN
  FOR pass IN 1..2 LOOP
   BEGIN
    WITH due AS MATERIALIZED (
        SELECT w.workqueue_id,
               (w.state ? 'delayed_until') AS is_delayed,
               (NOT (w.state ? 'delayed_until')
                AND requeue_due.expiry IS NOT NULL
                AND w.created_at < now() - requeue_due.expiry) AS is_expired,
               (NOT (w.state ? 'delayed_until')
                AND w.retries >= pepsi._retry_cap(w.stage, requeue_due.stages, requeue_due.max_retries,
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
               state = CASE WHEN w.workqueue_id = ANY (bare) THEN w.state
                            WHEN due.is_expired
                                 THEN w.state || '{"dispatch_error": "expired"}'
                            WHEN due.is_exhausted
                                 THEN w.state || '{"dispatch_error": "retries exhausted"}'
                            ELSE w.state - 'delayed_until' - 'pause_reason' END,
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
    EXIT;
   EXCEPTION WHEN program_limit_exceeded THEN
    IF pass > 1 THEN
        RAISE;
    END IF;
   END;
    -- The slow path: which due rows' note cannot be added?  The expression
    -- only, one block per row; nothing is written here.
    FOR r IN
        SELECT w.workqueue_id AS id, w.state,
               (requeue_due.expiry IS NOT NULL
                AND w.created_at < now() - requeue_due.expiry) AS is_expired
          FROM pepsi.workqueue AS w
         WHERE w.status = 'paused' AND w.timeout <= now()
           AND NOT (w.state ? 'delayed_until')
           AND ((requeue_due.expiry IS NOT NULL
                 AND w.created_at < now() - requeue_due.expiry)
                OR (w.retries >= pepsi._retry_cap(w.stage, requeue_due.stages,
                                              requeue_due.max_retries,
                                              requeue_due.default_max_retries)) IS TRUE)
         ORDER BY w.timeout
         LIMIT 10000
    LOOP
        BEGIN
            PERFORM r.state || CASE WHEN r.is_expired THEN '{"dispatch_error": "expired"}'::jsonb
                                    ELSE '{"dispatch_error": "retries exhausted"}'::jsonb END;
        EXCEPTION WHEN OTHERS THEN
            bare := bare || r.id;
            RAISE WARNING 'requeue_due: row % keeps its state without the dispatch_error (%: %)',
                r.id, SQLSTATE, SQLERRM;
        END;
    END LOOP;
  END LOOP;

    -- A new statement, so a new snapshot: the rows just moved are not paused.
    -- Finite timeouts only: a row paused until 'infinity' is never due.
    SELECT min(w.timeout) INTO next_due
      FROM pepsi.workqueue AS w
     WHERE w.status = 'paused' AND w.timeout < 'infinity'::timestamptz;
    RETURN NEXT;
END
$$;
