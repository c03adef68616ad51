-- pepsi.record_dispatch_error(dispatcher_id bigint, ids bigint[], statuses text[],
--                             errors text[])
--   → table(workqueue_id bigint, stage text, status text, timeout timestamptz)
--   The dispatcher's failures: a non-zero answer, a protocol error, a crash's
--   head-of-line message ('failed') and a MAX_RUNTIME timeout ('timeout').
--   For each i, if row ids[i] is still 'running' and held by dispatcher_id:
--     * automatic retry -- its stage is registered (pepsi.stages) with a
--       retry_delay and the row's retries < the stage's max_retries:
--       status 'paused', timeout := now() + the next delay, dispatcher_id
--       cleared; state.retry_error := errors[i] and state.pause_reason says
--       which retry it waits for.  requeue_due flips it back to pending with
--       retries + 1 when due, so MAX_RETRIES bounds these retries like any
--       other.  The delay is retry_delay × 2^retries, capped by
--       retry_delay_max (when set), times a random factor in [0.8, 1.2)
--       (jitter: failures of one moment do not all come back together), and
--       never more than retry_delay_max.
--     * otherwise (no retry_delay, retries used up, stage not registered): as
--       v2 -- status := statuses[i], state.dispatch_error := errors[i],
--       dispatcher_id cleared.
--   Returns one row per row changed with its new status ('failed', 'timeout'
--   or 'paused') and, for 'paused', when it is due.
--   Raises 22023 when the arrays differ in length or a status is not
--   'failed'/'timeout'.
--   Writes: pepsi.workqueue.  Reads: pepsi.stages.  Locks: the rows changed.
--   A row whose new state cannot be built (its state is near the jsonb size
--   limit, 255 MB: `state || ...` raises 54000) still gets its new status,
--   timeout and dispatcher_id cleared, with its state left untouched (no
--   dispatch_error/retry_error/pause_reason), and a WARNING names its id
--   and the error.
--   Guarantees: nothing is lost (payload and state stay as they were) and a
--   row this call should move is never left 'running' because of its state.
--   A row the stage already moved (advanced, finished, paused,
--   failed) or another dispatcher holds is never touched (the guard
--   `status = 'running'` and the fencing on dispatcher_id, re-checked in the
--   UPDATE).
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.record_dispatch_error(dispatcher_id bigint, ids bigint[],
                                                       statuses text[], errors text[])
RETURNS TABLE (workqueue_id bigint, stage text, status text, timeout timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    bare bigint[] := '{}';  -- rows whose state stays as it is
    r record;
    out_ids bigint[];
    out_stages text[];
    out_statuses text[];
    out_timeouts timestamptz[];
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(statuses)
       OR cardinality(ids) IS DISTINCT FROM cardinality(errors) THEN
        RAISE EXCEPTION 'ids, statuses and errors differ in length'
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(statuses) AS s(st)
                WHERE s.st IS NULL OR s.st NOT IN ('failed', 'timeout')) THEN
        RAISE EXCEPTION 'dispatch error status must be failed or timeout'
            USING ERRCODE = '22023';
    END IF;
    FOR pass IN 1..2 LOOP
        BEGIN
            WITH decision AS (
                SELECT w.workqueue_id AS id, u.st,
                       coalesce(u.err, 'dispatch error') AS err,
                       (s.retry_delay IS NOT NULL AND w.retries < s.max_retries) IS TRUE AS retry,
                       w.retries + 1 AS attempt, s.max_retries AS cap,
                       -- seconds: delay × 2^retries, capped, jittered, capped again
                       least(least(extract(epoch FROM s.retry_delay)::float8
                                       * power(2::float8, least(w.retries, 40)),
                                   coalesce(extract(epoch FROM s.retry_delay_max)::float8, 3e9),
                                   3e9)
                             * (0.8 + 0.4 * random()),
                             coalesce(extract(epoch FROM s.retry_delay_max)::float8, 3e9)) AS secs
                  FROM unnest(record_dispatch_error.ids, record_dispatch_error.statuses,
                              record_dispatch_error.errors) AS u(id, st, err)
                  JOIN pepsi.workqueue AS w ON w.workqueue_id = u.id
                  LEFT JOIN pepsi.stages AS s ON s.stage = w.stage
                 WHERE (w.status = 'running') IS TRUE  -- not the partial index: see v2
                   AND w.dispatcher_id = record_dispatch_error.dispatcher_id
            ), moved AS (
                UPDATE pepsi.workqueue AS w
                   SET status = CASE WHEN d.retry THEN 'paused' ELSE d.st END,
                       timeout = CASE WHEN d.retry THEN now() + make_interval(secs => d.secs) END,
                       dispatcher_id = NULL, updated_at = now(),
                       state = CASE WHEN w.workqueue_id = ANY (bare) THEN w.state
                                    WHEN d.retry
                                    THEN w.state || jsonb_build_object(
                                             'retry_error', d.err,
                                             'pause_reason', format('automatic retry %s of %s after: %s',
                                                                    d.attempt, d.cap, d.err))
                                    ELSE w.state || jsonb_build_object('dispatch_error', d.err) END
                  FROM decision AS d
                 WHERE w.workqueue_id = d.id
                   AND (w.status = 'running') IS TRUE
                   AND w.dispatcher_id = record_dispatch_error.dispatcher_id
                RETURNING w.workqueue_id, w.stage, w.status, w.timeout
            )
            SELECT array_agg(m.workqueue_id), array_agg(m.stage),
                   array_agg(m.status), array_agg(m.timeout)
              INTO out_ids, out_stages, out_statuses, out_timeouts
              FROM moved AS m;
            EXIT;
        EXCEPTION WHEN program_limit_exceeded THEN
            IF pass > 1 THEN
                RAISE;
            END IF;
        END;
        -- The slow path: which rows' new state cannot be built?  Only the
        -- expression, one block per row; nothing is written here.
        FOR r IN
            SELECT w.workqueue_id AS id, u.err, w.state,
                   (s.retry_delay IS NOT NULL AND w.retries < s.max_retries) IS TRUE AS retry,
                   w.retries + 1 AS attempt, s.max_retries AS cap
              FROM (SELECT DISTINCT ON (x.id) x.id, coalesce(x.err, 'dispatch error') AS err
                      FROM unnest(record_dispatch_error.ids, record_dispatch_error.errors)
                           AS x(id, err)
                     ORDER BY x.id) AS u
              JOIN pepsi.workqueue AS w ON w.workqueue_id = u.id
              LEFT JOIN pepsi.stages AS s ON s.stage = w.stage
             WHERE (w.status = 'running') IS TRUE
               AND w.dispatcher_id = record_dispatch_error.dispatcher_id
        LOOP
            BEGIN
                PERFORM CASE WHEN r.retry
                             THEN r.state || jsonb_build_object(
                                      'retry_error', r.err,
                                      'pause_reason', format('automatic retry %s of %s after: %s',
                                                             r.attempt, r.cap, r.err))
                             ELSE r.state || jsonb_build_object('dispatch_error', r.err) END;
            EXCEPTION WHEN OTHERS THEN
                bare := bare || r.id;
                RAISE WARNING 'record_dispatch_error: row % keeps its state without the note (%: %)',
                    r.id, SQLSTATE, SQLERRM;
            END;
        END LOOP;
    END LOOP;
    RETURN QUERY
    SELECT * FROM unnest(out_ids, out_stages, out_statuses, out_timeouts);
END
$$;
