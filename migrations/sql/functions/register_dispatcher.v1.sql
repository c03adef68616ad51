-- pepsi.register_dispatcher(hostname text, pid int, competing boolean) → bigint
--   Adds a dispatcher to the registry and returns its dispatcher_id, the
--   fencing token it writes into every row it claims.
--   Writes: pepsi.dispatchers (one INSERT).  Locks: none.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.register_dispatcher(hostname text, pid integer,
                                                     competing boolean)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    new_id bigint;
BEGIN
    INSERT INTO pepsi.dispatchers AS d (hostname, pid, competing)
    VALUES (coalesce(register_dispatcher.hostname, ''), coalesce(register_dispatcher.pid, 0),
            coalesce(register_dispatcher.competing, false))
    RETURNING d.dispatcher_id INTO new_id;
    RETURN new_id;
END
$$;
