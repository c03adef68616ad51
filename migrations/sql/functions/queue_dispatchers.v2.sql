-- pepsi.queue_dispatchers()
--   → table(dispatcher_id bigint, hostname text, pid int, competing boolean,
--           started_at timestamptz, heartbeat_age interval, running bigint,
--           live boolean)
--   Registered dispatchers for operators (pepsi-queue status) and for the
--   dispatcher's own "already served" message: when each last beat
--   (heartbeat_age = now() - heartbeat_at; a live one beats every
--   POLL_INTERVAL, competing ones more often), how many rows it holds
--   running, and whether it is live: its heartbeat no older than 3 × the
--   heartbeat_interval of its gauges, or than 5 minutes when its gauges carry
--   no interval (none sent yet, an older dispatcher; a non-number counts as
--   none), at least 10 s either way -- the rule of queue_overview v2 and
--   dashboard_snapshot v2.  Sorted by dispatcher_id.
--   Reads: pepsi.dispatchers, pepsi.workqueue (workqueue_running_idx).
--   Locks: none.
--   Callers: pepsi_dispatcher (operators use that role; SECURITY DEFINER).
--
-- Why v2 (migration 0014): the live column.  pepsi-queue status --watch
--   counted a dispatcher live when its heartbeat was younger than a fixed
--   120 s, whatever its POLL_INTERVAL, so its "N live" disagreed with the
--   live workers of queue_overview and with pepsi-httpd.  A new result
--   column: 0014 drops v1 and creates v2 (grants.v2.sql grants it again).
CREATE OR REPLACE FUNCTION pepsi.queue_dispatchers()
RETURNS TABLE (dispatcher_id bigint, hostname text, pid integer, competing boolean,
               started_at timestamptz, heartbeat_age interval, running bigint,
               live boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT d.dispatcher_id, d.hostname, d.pid, d.competing, d.started_at,
           now() - d.heartbeat_at,
           (SELECT count(*) FROM pepsi.workqueue AS w
             WHERE w.status = 'running' AND w.dispatcher_id = d.dispatcher_id),
           now() - d.heartbeat_at <= greatest(
               interval '10 s',
               coalesce(CASE WHEN jsonb_typeof(d.gauges -> 'heartbeat_interval') = 'number'
                             THEN make_interval(secs => 3 *
                                 (d.gauges ->> 'heartbeat_interval')::float8)
                        END,
                        interval '5 minutes'))
      FROM pepsi.dispatchers AS d
     ORDER BY d.dispatcher_id;
END
$$;
