-- pepsi.queue_dispatchers()
--   → table(dispatcher_id bigint, hostname text, pid int, competing boolean,
--           started_at timestamptz, heartbeat_age interval, running bigint)
--   Registered dispatchers for operators (pepsi-queue status): when each
--   last beat (heartbeat_age = now() - heartbeat_at; a live one beats every
--   POLL_INTERVAL, competing ones more often) and how many rows it holds
--   running.  Sorted by dispatcher_id.
--   Reads: pepsi.dispatchers, pepsi.workqueue (workqueue_running_idx).
--   Locks: none.
--   Callers: pepsi_dispatcher (operators use that role; SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.queue_dispatchers()
RETURNS TABLE (dispatcher_id bigint, hostname text, pid integer, competing boolean,
               started_at timestamptz, heartbeat_age interval, running bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT d.dispatcher_id, d.hostname, d.pid, d.competing, d.started_at,
           now() - d.heartbeat_at,
           (SELECT count(*) FROM pepsi.workqueue AS w
             WHERE w.status = 'running' AND w.dispatcher_id = d.dispatcher_id)
      FROM pepsi.dispatchers AS d
     ORDER BY d.dispatcher_id;
END
$$;
