-- replicas_away v1: after connecting, a competing replica claims nothing
-- while another replica may still run rows whose claims the server lost:
-- one that last heartbeated before the server (re)started, has no session,
-- and is younger than ORPHAN_TIMEOUT.  Registrations are simulated by
-- INSERTs with a chosen heartbeat (no session ever held their lock).
BEGIN;
SELECT plan(10);

-- The ids replicas_away lists, as one array.
CREATE FUNCTION pg_temp.away(me bigint, orphan_timeout interval) RETURNS bigint[]
LANGUAGE sql AS $$
    SELECT coalesce(array_agg(a.replica_id ORDER BY a.replica_id), '{}')
      FROM pepsi.replicas_away(me, orphan_timeout) AS a
$$;

SELECT greatest(pg_postmaster_start_time(), (SELECT stats_reset FROM pg_stat_bgwriter),
                pg_last_xact_replay_timestamp()) AS restart \gset
SELECT pepsi.register_dispatcher('me', 1, true) AS me \gset

SELECT is(pg_temp.away(:me, '1 day'), '{}', 'alone: nobody to wait for');

INSERT INTO pepsi.dispatchers (hostname, pid, competing, heartbeat_at)
VALUES ('before the restart', 2, true, timestamptz :'restart' - interval '1 s')
RETURNING dispatcher_id AS before_id \gset
INSERT INTO pepsi.dispatchers (hostname, pid, competing, heartbeat_at)
VALUES ('killed since', 3, true, now())
RETURNING dispatcher_id AS killed_id \gset
INSERT INTO pepsi.dispatchers (hostname, pid, competing, heartbeat_at)
VALUES ('also before', 4, true, timestamptz :'restart' - interval '2 s')
RETURNING dispatcher_id AS also_id \gset

SELECT is(pg_temp.away(:me, '1 day'), ARRAY[:before_id, :also_id]::bigint[],
          'replicas that last heartbeated before the server started are waited for');
SELECT results_eq(
    format('SELECT replica_id, hostname, pid FROM pepsi.replicas_away(%s, %L)', :me, '1 day'),
    format('VALUES (%s::bigint, %L::text, 2), (%s, %L, 4)',
           :before_id, 'before the restart', :also_id, 'also before'),
    'in id order, each with the host and process it registered from');
SELECT ok(NOT (:killed_id = ANY (pg_temp.away(:me, '1 day'))),
          'a replica killed while the server kept running is not waited for');
SELECT is(pg_temp.away(:me, now() - timestamptz :'restart'), '{}',
          'a replica whose heartbeat is older than ORPHAN_TIMEOUT is not waited for');
SELECT is(pg_temp.away(:before_id, '1 day'), ARRAY[:also_id]::bigint[],
          'the caller never waits for itself');
SELECT is(pg_temp.away(NULL, '1 day'), ARRAY[:before_id, :also_id]::bigint[],
          'NULL caller: every replica waited for');

-- Back: its session holds its liveness lock again (its heartbeat takes it).
SELECT pg_advisory_lock(1885629558, (:before_id & 2147483647)::int);
SELECT is(pg_temp.away(:me, '1 day'), ARRAY[:also_id]::bigint[],
          'a replica whose session is back is not waited for');
SELECT pepsi.heartbeat(:also_id);
SELECT is(pg_temp.away(:me, '1 day'), '{}', 'a heartbeat on the new server ends the wait');

SELECT ok(has_function_privilege('pepsi_dispatcher', 'pepsi.replicas_away(bigint, interval)',
                                 'execute')
          AND NOT has_function_privilege('pepsi_stage', 'pepsi.replicas_away(bigint, interval)',
                                         'execute'),
          'the dispatcher may ask; stage programs may not');

SELECT * FROM finish();
ROLLBACK;
