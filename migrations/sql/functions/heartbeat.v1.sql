-- pepsi.heartbeat(dispatcher_id bigint) → void
--   Sets heartbeat_at = now() for the dispatcher.
--   Raises P0002 (no_data_found) when the dispatcher is not registered any
--   more: another replica declared it dead (heartbeat older than
--   ORPHAN_TIMEOUT) and reset its running rows, so it must not go on as if
--   it still held them.
--   Writes: pepsi.dispatchers (one row).  Locks: that row.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.heartbeat(dispatcher_id bigint)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE pepsi.dispatchers AS d
       SET heartbeat_at = now()
     WHERE d.dispatcher_id = heartbeat.dispatcher_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'dispatcher % is not registered (declared dead by a replica?)',
                        heartbeat.dispatcher_id
            USING ERRCODE = 'P0002';
    END IF;
END
$$;
