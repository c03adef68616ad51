-- pepsi.heartbeat(dispatcher_id bigint, gauges jsonb default null) → void
--   Sets heartbeat_at = now() for the dispatcher and, when gauges is given,
--   stores it in dispatchers.gauges (the dispatcher's in-memory gauges, read
--   by pepsi-httpd's /metrics; NULL keeps the last ones).  If the registration
--   is gone — a competing replica found the heartbeat older than
--   ORPHAN_TIMEOUT, removed it and reset its running rows — it is re-created
--   under the same id and a WARNING says so (as in v2).
--   The calling session takes the dispatcher's liveness lock when it does not
--   hold it yet (pepsi._dispatcher_hold): after a reconnect the dispatcher is
--   live again from its next heartbeat.
--   Writes: pepsi.dispatchers (one row).  Locks: that row; the liveness
--   advisory lock, session level.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.heartbeat(dispatcher_id bigint, gauges jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    IF heartbeat.dispatcher_id IS NULL THEN
        RAISE EXCEPTION 'heartbeat needs a dispatcher_id' USING ERRCODE = '22004';
    END IF;
    UPDATE pepsi.dispatchers AS d
       SET heartbeat_at = now(),
           gauges = coalesce(heartbeat.gauges, d.gauges)
     WHERE d.dispatcher_id = heartbeat.dispatcher_id;
    IF NOT FOUND THEN
        INSERT INTO pepsi.dispatchers (dispatcher_id, hostname, pid, competing, gauges)
        OVERRIDING SYSTEM VALUE
        VALUES (heartbeat.dispatcher_id, 're-registered by heartbeat', 0, true, heartbeat.gauges)
        ON CONFLICT DO NOTHING;
        RAISE WARNING 'dispatcher % was not registered (declared dead by a replica); re-registered',
                      heartbeat.dispatcher_id;
    END IF;
    PERFORM pepsi._dispatcher_hold(heartbeat.dispatcher_id);
END
$$;
