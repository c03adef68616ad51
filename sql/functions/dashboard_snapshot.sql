-- pepsi.dashboard_snapshot(live_within interval default '5 minutes') → jsonb
--   Everything pepsi-httpd shows and exports, in one call (one round trip per
--   scrape; pepsi-httpd caches it for a second):
--     now               epoch seconds (database clock)
--     queue             [{stage, status, count, oldest_age}] for every stage of
--                       the registry (pepsi.stages) and every stage with rows,
--                       times every status (pending, running, paused, done,
--                       failed, timeout, expired), zeros included, so no
--                       series vanishes when a stage drains; oldest_age is
--                       the seconds since the oldest row of that stage and
--                       status last changed (its updated_at), 0 when none
--     oldest_pending    {stage: seconds since the oldest pending row of the
--                       stage became pending (its updated_at)}, 0 when none,
--                       for every stage of queue
--     retries_due       {stage: paused rows whose timeout has passed}, 0 when
--                       none, for every stage of queue
--     stage_stats       [{stage, processed, failed, timeouts, crashes,
--                       processing_seconds}] as they are now (pepsi._live_stats:
--                       stage_stats plus the live dispatchers' unflushed deltas)
--     totals            the dispatch_stats row (stage_runs, messages, …), plus
--                       the live dispatchers' unflushed deltas too
--     dispatchers       [{dispatcher_id, hostname, pid, competing, started_at,
--                       heartbeat_age, live, gauges}] (v5) of the live
--                       dispatchers only: those whose session is there
--                       (pepsi._dispatcher_live), whatever their heartbeat's
--                       age -- the rule of queue_overview, queue_dispatchers
--                       and stage_health; live is always true (kept for
--                       readers of v4); live_within is no longer used
--     dispatcher_session  true while some session of this database holds
--                       the dispatcher lock (the advisory lock every serving
--                       dispatcher takes on its listen connection: exclusive,
--                       or shared by competing replicas).  A dispatcher killed
--                       with SIGKILL loses its sessions, and with them the lock,
--                       at once; its heartbeat stays fresh for up to 3 heartbeat
--                       intervals.  pepsi-httpd's /healthz wants both.
--     overlay           [[section, option, value]] (v5) the pepsi.config rows the
--                       dashboard shows: [stage-*] sections, options PROGRAM,
--                       NEXT, PARALLELISM, QUEUE_LIMIT, MAX_MESSAGES,
--                       MAX_RETRIES, RETRY_DELAY, RETRY_DELAY_MAX, PAUSED (any
--                       case), and none whose value looks like it carries a
--                       credential (password, secret, dsn, a URL with a user).
--                       Never WORKER_DSN, DSN or any other option
--     stages            (v4) [{stage, next, parallelism, queue_limit,
--                       max_retries}] the stage registry the dispatcher
--                       writes (register_stages): pepsi-httpd draws the graph
--                       from it, so it needs no copy of the configuration
--     stage_health      (v4) [{stage, state, cause, since, held_seconds,
--                       pending, dispatchers}] pepsi.stage_health(), since as
--                       epoch seconds
--     failure_reasons   [{stage, reason, count, newest_id, raw}] rows in
--                       failed, timeout or expired grouped by stage and (v4)
--                       normalised reason (pepsi._normalise_reason of
--                       dispatch_error, else error, else the status); raw is
--                       up to 5 [{reason, count}] of the reasons as written,
--                       most frequent first; largest groups first, at most 100
--   Guarantees: one statement snapshot (STABLE), nothing written.
--   Reads: workqueue (one full scan, like queue_counts), stage_stats,
--   dispatch_stats, dispatchers, stages, config, pg_locks.  Locks: none.
--   Callers: pepsi_dashboard (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.dashboard_snapshot(live_within interval DEFAULT '5 minutes')
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    result jsonb;
BEGIN
    WITH rows_by AS (
        SELECT w.stage, w.status, count(*) AS n,
               min(w.updated_at) AS oldest,
               count(*) FILTER (WHERE w.status = 'paused' AND w.timeout <= now()) AS due
          FROM pepsi.messages AS w
         GROUP BY w.stage, w.status
    ), names AS (
        SELECT r.stage FROM rows_by AS r UNION SELECT s.stage FROM pepsi.stages AS s
    ), q AS (
        SELECT n.stage, st.status, coalesce(r.n, 0) AS n,
               coalesce(extract(epoch FROM now() - r.oldest), 0) AS oldest_age,
               coalesce(r.due, 0) AS due
          FROM names AS n
         CROSS JOIN unnest(ARRAY['pending', 'running', 'paused', 'done', 'failed', 'timeout',
                                 'expired']) AS st(status)
          LEFT JOIN rows_by AS r ON r.stage = n.stage AND r.status = st.status
    ), raw AS (
        SELECT w.stage,
               coalesce(w.state ->> 'dispatch_error', w.state ->> 'error', w.status) AS reason,
               count(*) AS n, max(w.workqueue_id) AS newest_id
          FROM pepsi.messages AS w
         WHERE w.status IN ('failed', 'timeout', 'expired')
         GROUP BY 1, 2
    ), f AS (
        SELECT r.stage, pepsi._normalise_reason(r.reason) AS reason,
               sum(r.n)::bigint AS n, max(r.newest_id) AS newest_id,
               (array_agg(jsonb_build_object('reason', r.reason, 'count', r.n)
                          ORDER BY r.n DESC, r.newest_id DESC))[1:5] AS raw
          FROM raw AS r
         GROUP BY 1, 2
         ORDER BY 3 DESC, 4 DESC
         LIMIT 100
    )
    SELECT jsonb_build_object(
        'now', extract(epoch FROM now()),
        'queue', coalesce((SELECT jsonb_agg(jsonb_build_object(
                               'stage', q.stage, 'status', q.status, 'count', q.n,
                               'oldest_age', q.oldest_age)
                               ORDER BY q.stage, q.status) FROM q), '[]'),
        'oldest_pending', coalesce((SELECT jsonb_object_agg(q.stage, q.oldest_age) FROM q
                               WHERE q.status = 'pending'), '{}'),
        'retries_due', coalesce((SELECT jsonb_object_agg(q.stage, q.due) FROM q
                               WHERE q.status = 'paused'), '{}'),
        'stage_stats', coalesce((SELECT jsonb_agg(jsonb_build_object(
                               'stage', s.stage, 'processed', s.processed, 'failed', s.failed,
                               'timeouts', s.timeouts, 'crashes', s.crashes,
                               'processing_seconds', s.processing_seconds) ORDER BY s.stage)
                               FROM pepsi._live_stats() AS s), '[]'),
        'totals', (SELECT jsonb_build_object(
                              'stage_runs', d.stage_runs + u.stage_runs,
                              'messages', d.messages + u.messages,
                              'failed', d.failed + s.failed, 'timeouts', d.timeouts + s.timeouts,
                              'crashes', d.crashes + s.crashes,
                              'requeued', d.requeued + u.requeued,
                              'expired', d.expired + u.expired)
                     FROM pepsi.dispatch_stats AS d,
                          (SELECT coalesce(sum((g.x ->> 'stage_runs')::bigint), 0) AS stage_runs,
                                  coalesce(sum((g.x ->> 'messages')::bigint), 0) AS messages,
                                  coalesce(sum((g.x ->> 'requeued')::bigint), 0) AS requeued,
                                  coalesce(sum((g.x ->> 'expired')::bigint), 0) AS expired
                             FROM (SELECT dd.gauges -> 'unflushed' -> 'dispatch' AS x
                                     FROM pepsi.dispatchers AS dd
                                    WHERE pepsi._dispatcher_live(dd.dispatcher_id)) AS g
                            WHERE jsonb_typeof(g.x) = 'object') AS u,
                          (SELECT coalesce(sum(l.failed), 0) - coalesce((SELECT sum(ss.failed)
                                      FROM pepsi.stage_stats AS ss), 0) AS failed,
                                  coalesce(sum(l.timeouts), 0) - coalesce((SELECT sum(ss.timeouts)
                                      FROM pepsi.stage_stats AS ss), 0) AS timeouts,
                                  coalesce(sum(l.crashes), 0) - coalesce((SELECT sum(ss.crashes)
                                      FROM pepsi.stage_stats AS ss), 0) AS crashes
                             FROM pepsi._live_stats() AS l) AS s
                    WHERE d.id),
        'dispatchers', coalesce((SELECT jsonb_agg(jsonb_build_object(
                               'dispatcher_id', d.dispatcher_id, 'hostname', d.hostname,
                               'pid', d.pid, 'competing', d.competing,
                               'started_at', extract(epoch FROM d.started_at),
                               'heartbeat_age', extract(epoch FROM now() - d.heartbeat_at),
                               'live', true,
                               'gauges', d.gauges) ORDER BY d.dispatcher_id)
                               FROM pepsi.dispatchers AS d
                              WHERE pepsi._dispatcher_live(d.dispatcher_id)), '[]'),
        'overlay', coalesce((SELECT jsonb_agg(jsonb_build_array(c.section, c.option, c.value)
                               ORDER BY c.section, c.option)
                               FROM pepsi.config AS c
                              WHERE lower(c.section) LIKE 'stage-%'
                                AND upper(c.option) IN ('PROGRAM', 'NEXT', 'PARALLELISM',
                                                        'QUEUE_LIMIT', 'MAX_MESSAGES',
                                                        'MAX_RETRIES', 'RETRY_DELAY',
                                                        'RETRY_DELAY_MAX', 'PAUSED')
                                AND c.value !~* '(password|passwd|secret|dsn|postgres(ql)?://|://[^/@]*@)'),
                            '[]'),
        'dispatcher_session', EXISTS (
                               -- the lock key 'pepsidsp' as (classid, objid), objsubid 1
                               SELECT 1 FROM pg_catalog.pg_locks AS l
                                WHERE l.locktype = 'advisory' AND l.granted
                                  AND l.database = (SELECT b.oid FROM pg_catalog.pg_database AS b
                                                     WHERE b.datname = current_database())
                                  AND l.classid = 1885696115::bigint::oid
                                  AND l.objid = 1768190832::bigint::oid
                                  AND l.objsubid = 1),
        'stages', coalesce((SELECT jsonb_agg(jsonb_build_object(
                               'stage', s.stage, 'next', to_jsonb(s.next),
                               'parallelism', s.parallelism, 'queue_limit', s.queue_limit,
                               'max_retries', s.max_retries) ORDER BY s.stage)
                               FROM pepsi.stages AS s), '[]'),
        'stage_health', coalesce((SELECT jsonb_agg(jsonb_build_object(
                               'stage', h.stage, 'state', h.state, 'cause', h.cause,
                               'since', extract(epoch FROM h.since),
                               'held_seconds', h.held_seconds, 'pending', h.pending,
                               'dispatchers', h.dispatchers) ORDER BY h.stage)
                               FROM pepsi.stage_health() AS h), '[]'),
        'failure_reasons', coalesce((SELECT jsonb_agg(jsonb_build_object(
                               'stage', f.stage, 'reason', f.reason, 'count', f.n,
                               'newest_id', f.newest_id, 'raw', to_jsonb(f.raw))
                               ORDER BY f.n DESC, f.newest_id DESC)
                               FROM f), '[]'))
      INTO result;
    RETURN result;
END
$$;
