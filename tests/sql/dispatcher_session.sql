-- Migration 0016: dashboard_snapshot v3's dispatcher_session, which pepsi-httpd's
-- /healthz requires besides a fresh heartbeat: true while some session of this
-- database holds the dispatcher lock (advisory key 'pepsidsp' =
-- 8099003145887445872), exclusive or shared.  v2 has no such key, so all
-- but the last test fail against it.
BEGIN;
SELECT plan(7);

CREATE FUNCTION pg_temp.session() RETURNS boolean LANGUAGE sql AS $$
    SELECT (pepsi.dashboard_snapshot() ->> 'dispatcher_session')::boolean $$;

SELECT is(pg_temp.session(), false, 'no one holds the dispatcher lock: no dispatcher session');

-- Another advisory key, and the key's halves as a two-int key, are not the lock.
SELECT pg_advisory_xact_lock(42);
SELECT pg_advisory_xact_lock(1885696115, 1768190832);
SELECT is(pg_temp.session(), false, 'other advisory locks (a bigint 42, the halves as an int pair) do not count');

SELECT pg_advisory_lock(8099003145887445872);
SELECT is(pg_temp.session(), true, 'the exclusive lock of a single dispatcher: a dispatcher session');
SELECT pg_advisory_unlock(8099003145887445872);
SELECT is(pg_temp.session(), false, 'released: none again');

SELECT pg_advisory_lock_shared(8099003145887445872);
SELECT is(pg_temp.session(), true, 'the shared lock of competing replicas: a dispatcher session');
SELECT pg_advisory_unlock_shared(8099003145887445872);

-- A fresh heartbeat does not make a session (that is the point of the key).
SELECT pepsi.register_dispatcher('h', 1, false) AS d \gset
SELECT is(pg_temp.session(), false, 'a registered dispatcher with a fresh heartbeat but no session: none');

-- The rest of the snapshot is v2's: the heartbeat still decides 'live'.
SELECT is((SELECT (e ->> 'live')::boolean
             FROM jsonb_array_elements(pepsi.dashboard_snapshot() -> 'dispatchers') AS e
            WHERE (e ->> 'dispatcher_id')::bigint = :d), true,
          'the dispatcher row is still live by its heartbeat');

SELECT * FROM finish();
ROLLBACK;
