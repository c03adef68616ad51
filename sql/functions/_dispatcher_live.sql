-- pepsi._dispatcher_live(dispatcher_id bigint) → boolean
--   Is the dispatcher's session there?  True while some session of this
--   database holds the dispatcher's own liveness lock: the session-level
--   advisory lock (1885629558, dispatcher_id & 2147483647) -- 'pdlv' and the
--   id as a pair of int4, so objsubid 2 in pg_locks -- that
--   register_dispatcher (v2) and every heartbeat (v4) take on the calling
--   connection.  A dispatcher killed with SIGKILL (or by the OOM killer)
--   loses its connections and with them the lock at once, while its
--   heartbeat stays fresh for up to 3 heartbeat intervals: liveness by the
--   session, not by heartbeat age (the rule pepsi-httpd's /healthz already
--   applied to the database as a whole).
--   NULL id: false.
--   Reads: pg_locks.  Writes: nothing.  Locks: none.
--   Callers: granted to nobody (queue_dispatchers, queue_overview and
--   dashboard_snapshot call it).
CREATE OR REPLACE FUNCTION pepsi._dispatcher_live(dispatcher_id bigint)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
    SELECT EXISTS (
        SELECT 1
          FROM pg_catalog.pg_locks AS l
         WHERE l.locktype = 'advisory' AND l.granted
           AND l.database = (SELECT b.oid FROM pg_catalog.pg_database AS b
                              WHERE b.datname = current_database())
           AND l.classid = 1885629558::oid
           AND l.objid = ($1 & 2147483647)::oid
           AND l.objsubid = 2)
$$;
