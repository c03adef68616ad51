-- pepsi.dashboard_snapshot(live_within interval default '5 minutes') → jsonb
--   Everything pepsi-httpd shows and exports, in one call (one round trip per
--   scrape; pepsi-httpd caches it for a second):
--     now               epoch seconds (database clock)
--     queue             [{stage, status, count}] live rows by stage and status
--     oldest_pending    {stage: seconds since the oldest pending row of the
--                       stage became pending (its updated_at)}
--     retries_due       {stage: paused rows whose timeout has passed}
--     stage_stats       [{stage, processed, failed, timeouts, crashes,
--                       processing_seconds}]
--     totals            the dispatch_stats row (stage_runs, messages, …)
--     dispatchers       [{dispatcher_id, hostname, pid, competing, started_at,
--                       heartbeat_age, live, gauges}]; live = heartbeat no older
--                       than 3 × the heartbeat interval the dispatcher reported
--                       in its gauges, or than live_within when its gauges carry
--                       no interval (none sent yet, an older dispatcher), at
--                       least 10 s either way -- the rule of queue_overview v2
--                       and queue_dispatchers v2; a heartbeat_interval that is
--                       not a JSON number counts as none
--     dispatcher_session  (v3) true while some session of this database holds
--                       the dispatcher lock (the advisory lock every serving
--                       dispatcher takes on its listen connection: exclusive,
--                       or shared by competing replicas).  A dispatcher killed
--                       with SIGKILL loses its sessions, and with them the lock,
--                       at once; its heartbeat stays fresh for up to 3 heartbeat
--                       intervals (90 s at POLL_INTERVAL 30 s).  pepsi-httpd's
--                       /healthz wants both.
--     overlay           [[section, option, value]] the pepsi.config rows
--     failure_reasons   [{stage, reason, count, newest_id}] rows in failed,
--                       timeout or expired grouped by reason (as in
--                       failed_messages: dispatch_error, else error, else the
--                       status), largest groups first, at most 100
--   Guarantees: one statement snapshot (STABLE), nothing written.
--   Reads: workqueue (one full scan, like queue_counts), stage_stats,
--   dispatch_stats, dispatchers, config, pg_locks.  Locks: none.
--   Callers: pepsi_dashboard (SECURITY DEFINER).
--
-- Why v2 (migration 0014): v1 computed live as
--   age <= coalesce(make_interval(secs => greatest(10.0, 3 * interval)), live_within);
--   greatest() ignores NULL, so without an interval it gave 10 s, never NULL,
--   and the live_within fallback was dead: a dispatcher whose gauges carry no
--   heartbeat_interval showed as not live 10 s after its heartbeat (and
--   pepsi-httpd exported it so) while queue_overview counted it live for
--   5 minutes.  v2 takes the coalesce inside the greatest, as queue_overview
--   v2 does.  Same signature and result type.
--
-- Why v3 (migration 0016): /healthz answered 200 for up to 90 s after the
--   dispatcher was killed with SIGKILL (or by the OOM killer), until its
--   heartbeat aged out.  v3 adds dispatcher_session; everything else is v2's.
--   Same signature and result type.
CREATE OR REPLACE FUNCTION pepsi.dashboard_snapshot(live_within interval DEFAULT '5 minutes')
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    result jsonb;
BEGIN
    WITH q AS (
        SELECT w.stage, w.status, count(*) AS n,
               min(w.updated_at) AS oldest,
               count(*) FILTER (WHERE w.status = 'paused' AND w.timeout <= now()) AS due
          FROM pepsi.workqueue AS w
         GROUP BY w.stage, w.status
    ), f AS (
        SELECT w.stage,
               coalesce(w.state ->> 'dispatch_error', w.state ->> 'error', w.status) AS reason,
               count(*) AS n, max(w.workqueue_id) AS newest_id
          FROM pepsi.workqueue AS w
         WHERE w.status IN ('failed', 'timeout', 'expired')
         GROUP BY 1, 2
         ORDER BY 3 DESC, 4 DESC
         LIMIT 100
    )
    SELECT jsonb_build_object(
        'now', extract(epoch FROM now()),
        'queue', coalesce((SELECT jsonb_agg(jsonb_build_object(
                               'stage', q.stage, 'status', q.status, 'count', q.n)
                               ORDER BY q.stage, q.status) FROM q), '[]'),
        'oldest_pending', coalesce((SELECT jsonb_object_agg(q.stage,
                               extract(epoch FROM now() - q.oldest)) FROM q
                               WHERE q.status = 'pending'), '{}'),
        'retries_due', coalesce((SELECT jsonb_object_agg(q.stage, q.due) FROM q
                               WHERE q.status = 'paused'), '{}'),
        'stage_stats', coalesce((SELECT jsonb_agg(jsonb_build_object(
                               'stage', s.stage, 'processed', s.processed, 'failed', s.failed,
                               'timeouts', s.timeouts, 'crashes', s.crashes,
                               'processing_seconds', s.processing_seconds) ORDER BY s.stage)
                               FROM pepsi.stage_stats AS s), '[]'),
        'totals', (SELECT to_jsonb(d) - 'id' - 'updated_at' FROM pepsi.dispatch_stats AS d
                    WHERE d.id),
        'dispatchers', coalesce((SELECT jsonb_agg(jsonb_build_object(
                               'dispatcher_id', d.dispatcher_id, 'hostname', d.hostname,
                               'pid', d.pid, 'competing', d.competing,
                               'started_at', extract(epoch FROM d.started_at),
                               'heartbeat_age', extract(epoch FROM now() - d.heartbeat_at),
                               'live', now() - d.heartbeat_at <= greatest(
                                   interval '10 s',
                                   coalesce(CASE WHEN jsonb_typeof(d.gauges -> 'heartbeat_interval')
                                                      = 'number'
                                                 THEN make_interval(secs => 3 *
                                                     (d.gauges ->> 'heartbeat_interval')::float8)
                                            END,
                                            dashboard_snapshot.live_within)),
                               'gauges', d.gauges) ORDER BY d.dispatcher_id)
                               FROM pepsi.dispatchers AS d), '[]'),
        'overlay', coalesce((SELECT jsonb_agg(jsonb_build_array(c.section, c.option, c.value)
                               ORDER BY c.section, c.option) FROM pepsi.config AS c), '[]'),
        'dispatcher_session', EXISTS (
                               -- the lock key 'pepsidsp' as (classid, objid), objsubid 1
                               SELECT 1 FROM pg_catalog.pg_locks AS l
                                WHERE l.locktype = 'advisory' AND l.granted
                                  AND l.database = (SELECT b.oid FROM pg_catalog.pg_database AS b
                                                     WHERE b.datname = current_database())
                                  AND l.classid = 1885696115::bigint::oid
                                  AND l.objid = 1768190832::bigint::oid
                                  AND l.objsubid = 1),
        'failure_reasons', coalesce((SELECT jsonb_agg(jsonb_build_object(
                               'stage', f.stage, 'reason', f.reason, 'count', f.n,
                               'newest_id', f.newest_id) ORDER BY f.n DESC, f.newest_id DESC)
                               FROM f), '[]'))
      INTO result;
    RETURN result;
END
$$;
