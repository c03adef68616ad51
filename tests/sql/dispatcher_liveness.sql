-- One liveness rule for dispatchers in dashboard_snapshot, queue_dispatchers
-- and queue_overview: live while the dispatcher's session is there (the
-- liveness lock its registration and heartbeats take; pepsi._dispatcher_live),
-- whatever its heartbeat's age or the interval in its gauges.  (Migration 0014
-- made the three agree on a heartbeat-age rule; migration 0017 replaced the
-- rule by the session, which a dispatcher killed with SIGKILL loses at once.)
BEGIN;
SELECT plan(12);

CREATE FUNCTION pg_temp.snap_live(d bigint) RETURNS boolean LANGUAGE sql AS $$
    SELECT coalesce((SELECT (e ->> 'live')::boolean
                       FROM jsonb_array_elements(pepsi.dashboard_snapshot() -> 'dispatchers') AS e
                      WHERE (e ->> 'dispatcher_id')::bigint = d), false) $$;
CREATE FUNCTION pg_temp.cli_live(d bigint) RETURNS boolean LANGUAGE sql AS $$
    SELECT live FROM pepsi.queue_dispatchers() WHERE dispatcher_id = d $$;
CREATE FUNCTION pg_temp.overview_live(d bigint) RETURNS boolean LANGUAGE sql AS $$
    SELECT coalesce((SELECT dispatchers > 0 FROM pepsi.queue_overview() WHERE stage = 'live_' || d), false) $$;
CREATE FUNCTION pg_temp.beat(d bigint, gauges jsonb, age interval) RETURNS void LANGUAGE sql AS $$
    UPDATE pepsi.dispatchers
       SET gauges = beat.gauges || jsonb_build_object('workers',
               jsonb_build_object('live_' || d, '{"busy": 1}'::jsonb)),
           heartbeat_at = now() - age
     WHERE dispatcher_id = d $$;

SELECT pepsi.register_dispatcher('h', 1, false) AS d \gset

-- With its session: live, however old the heartbeat and whatever the gauges say.
SELECT pg_temp.beat(:d, '{}', '6 minutes');
SELECT is(pg_temp.snap_live(:d), true, 'dashboard_snapshot: session there, beat 6 minutes ago: live');
SELECT is(pg_temp.cli_live(:d), true, 'queue_dispatchers: the same');
SELECT is(pg_temp.overview_live(:d), true, 'queue_overview: the same');
SELECT pg_temp.beat(:d, '{"heartbeat_interval": "soon"}', '70 s');
SELECT is(pg_temp.snap_live(:d), true, 'dashboard_snapshot: a non-number interval breaks nothing');
SELECT is(pg_temp.cli_live(:d), true, 'queue_dispatchers: the same');

-- Without it (the connection that held the lock is gone): not live, however
-- fresh the heartbeat.
SELECT pg_temp.beat(:d, '{"heartbeat_interval": 20}', '0 s');
SELECT pg_advisory_unlock(1885629558, (:d & 2147483647)::int);
SELECT is(pg_temp.snap_live(:d), false, 'dashboard_snapshot: no session, fresh heartbeat: not listed');
SELECT is(pg_temp.cli_live(:d), false, 'queue_dispatchers: the same');
SELECT is(pg_temp.overview_live(:d), false, 'queue_overview: the same');

-- Another advisory lock of the session (other key, or the id under another
-- key) does not count.
SELECT pg_advisory_lock(1885629558::bigint);
SELECT pg_advisory_lock(42, (:d & 2147483647)::int);
SELECT is(pg_temp.cli_live(:d), false, 'other advisory locks do not make a dispatcher live');
SELECT pg_advisory_unlock_all();

-- The next heartbeat (a dispatcher that re-established its connection) takes
-- the lock again.
SELECT pepsi.heartbeat(:d);
SELECT is(pg_temp.snap_live(:d), true, 'dashboard_snapshot: live again after its next heartbeat');
SELECT is(pg_temp.cli_live(:d), true, 'queue_dispatchers: the same');
SELECT is(pg_temp.overview_live(:d), true, 'queue_overview: the same');

SELECT * FROM finish();
ROLLBACK;
