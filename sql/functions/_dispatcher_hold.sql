-- pepsi._dispatcher_hold(dispatcher_id bigint) → boolean
--   Takes the dispatcher's liveness lock (see _dispatcher_live) on the
--   calling session, unless this session holds it already (so a heartbeat
--   every few seconds does not stack lock counts).  Session-level: it stays
--   after the calling transaction ends (even when that rolls back) and goes
--   with the session.  A dispatcher whose connection was re-established
--   takes it again on its next heartbeat.  Returns whether this session
--   holds it afterwards (false while an older session of the same id still
--   holds it: that one goes when its connection does).
--   Writes: nothing.  Locks: that advisory lock, session level.
--   Callers: granted to nobody (register_dispatcher and heartbeat call it).
CREATE OR REPLACE FUNCTION pepsi._dispatcher_hold(dispatcher_id bigint)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    IF _dispatcher_hold.dispatcher_id IS NULL THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT 1
                 FROM pg_catalog.pg_locks AS l
                WHERE l.pid = pg_backend_pid() AND l.locktype = 'advisory' AND l.granted
                  AND l.classid = 1885629558::oid
                  AND l.objid = (_dispatcher_hold.dispatcher_id & 2147483647)::oid
                  AND l.objsubid = 2) THEN
        RETURN true;
    END IF;
    RETURN pg_try_advisory_lock(1885629558,
                                (_dispatcher_hold.dispatcher_id & 2147483647)::integer);
END
$$;
