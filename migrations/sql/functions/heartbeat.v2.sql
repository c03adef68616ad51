-- pepsi.heartbeat(dispatcher_id bigint) → void
--   Sets heartbeat_at = now() for the dispatcher.  If the registration is
--   gone — a competing replica found the heartbeat older than
--   ORPHAN_TIMEOUT (say, after a long network partition), removed it and
--   reset its running rows — it is re-created under the same id and a
--   WARNING says so.  That is safe: the rows were reset to pending, and
--   every late write of the old workers is fenced by dispatcher_id.
--   Writes: pepsi.dispatchers (one row).  Locks: that row.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
--
-- Why v2 (migration 0004): v1 raised P0002 when the registration was gone.
-- The dispatcher (loop.py, _heartbeat) treats any database error as a lost
-- connection and reconnects, and heartbeats again after reconnecting, so a
-- replica that had been declared dead would reconnect forever
-- instead of carrying on; re-registering ends that loop.
CREATE OR REPLACE FUNCTION pepsi.heartbeat(dispatcher_id bigint)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    IF heartbeat.dispatcher_id IS NULL THEN
        RAISE EXCEPTION 'heartbeat needs a dispatcher_id' USING ERRCODE = '22004';
    END IF;
    UPDATE pepsi.dispatchers AS d
       SET heartbeat_at = now()
     WHERE d.dispatcher_id = heartbeat.dispatcher_id;
    IF NOT FOUND THEN
        INSERT INTO pepsi.dispatchers (dispatcher_id, hostname, pid, competing)
        OVERRIDING SYSTEM VALUE
        VALUES (heartbeat.dispatcher_id, 're-registered by heartbeat', 0, true)
        ON CONFLICT DO NOTHING;
        RAISE WARNING 'dispatcher % was not registered (declared dead by a replica); re-registered',
                      heartbeat.dispatcher_id;
    END IF;
END
$$;
