-- pepsi.dispatcher_registered(dispatcher_id bigint) → boolean
--   Is the dispatcher's registration row there?  False once a competing
--   replica found its heartbeat older than ORPHAN_TIMEOUT, removed it and
--   reset its running rows (reset_orphans); the dispatcher then kills its
--   workers and drops what they held before heartbeat registers it again.
--   NULL id: false.
--   Reads: pepsi.dispatchers (primary key).  Locks: none.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.dispatcher_registered(dispatcher_id bigint)
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN EXISTS (SELECT 1
                     FROM pepsi.dispatchers AS d
                    WHERE d.dispatcher_id = dispatcher_registered.dispatcher_id);
END
$$;
