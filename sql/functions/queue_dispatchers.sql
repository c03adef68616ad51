-- pepsi.queue_dispatchers()
--   → table(dispatcher_id bigint, hostname text, pid int, competing boolean,
--           started_at timestamptz, heartbeat_age interval, running bigint,
--           live boolean)
--   Registered dispatchers for operators (pepsi-queue status) and for the
--   dispatcher's own "already served" message: when each last beat
--   (heartbeat_age = now() - heartbeat_at; a live one beats every
--   POLL_INTERVAL, competing ones more often), how many rows it holds
--   running, and whether it is live: its session is there
--   (pepsi._dispatcher_live: the liveness lock its registration and
--   heartbeats take), whatever the heartbeat's age.  Sorted by dispatcher_id.
--   Reads: pepsi.dispatchers, pepsi.workqueue (workqueue_running_idx),
--   pg_locks.  Locks: none.
--   Callers: pepsi_dispatcher, pepsi_operator (SECURITY DEFINER; pepsi-queue: people
--   used the dispatcher's role before pepsi_operator existed).
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
           pepsi._dispatcher_live(d.dispatcher_id)
      FROM pepsi.dispatchers AS d
     ORDER BY d.dispatcher_id;
END
$$;
