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
--                       heartbeat_age, live, gauges}]; live = heartbeat younger
--                       than 3 × the heartbeat interval the dispatcher reported
--                       in its gauges (at least 10 s), else than live_within
--     overlay           [[section, option, value]] the pepsi.config rows
--     failure_reasons   [{stage, reason, count, newest_id}] rows in failed,
--                       timeout or expired grouped by reason (as in
--                       failed_messages: dispatch_error, else error, else the
--                       status), largest groups first, at most 100
--   Guarantees: one statement snapshot (STABLE), nothing written.
--   Reads: workqueue (one full scan, like queue_counts), stage_stats,
--   dispatch_stats, dispatchers, config.  Locks: none.
--   Callers: pepsi_dashboard (SECURITY DEFINER).
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
                               'live', now() - d.heartbeat_at <= coalesce(
                                   make_interval(secs => greatest(10.0, 3 *
                                       (d.gauges ->> 'heartbeat_interval')::float8)),
                                   dashboard_snapshot.live_within),
                               'gauges', d.gauges) ORDER BY d.dispatcher_id)
                               FROM pepsi.dispatchers AS d), '[]'),
        'overlay', coalesce((SELECT jsonb_agg(jsonb_build_array(c.section, c.option, c.value)
                               ORDER BY c.section, c.option) FROM pepsi.config AS c), '[]'),
        'failure_reasons', coalesce((SELECT jsonb_agg(jsonb_build_object(
                               'stage', f.stage, 'reason', f.reason, 'count', f.n,
                               'newest_id', f.newest_id) ORDER BY f.n DESC, f.newest_id DESC)
                               FROM f), '[]'))
      INTO result;
    RETURN result;
END
$$;
