-- Schedules: pepsi.register_schedules, pepsi.fire_schedule (a tick is
-- enqueued once, recorded in the same transaction, also under two
-- concurrent callers), pepsi.schedules / dashboard_schedules.
\set pghost ''
\set pgport ''
\set pguser ''
\set pgpassword ''
\getenv pghost PGHOST
\getenv pgport PGPORT
\getenv pguser PGUSER
\getenv pgpassword PGPASSWORD
BEGIN;
SELECT plan(27);
CREATE EXTENSION IF NOT EXISTS dblink;

SELECT results_eq($$SELECT name, last_tick, settled_through FROM pepsi.register_schedules(
        ARRAY['hourly', 'minutely'], ARRAY['s', 's'], ARRAY['CRON 0 * * * * (UTC)', 'EVERY 60 s'],
        ARRAY[now() + interval '1 h', now() + interval '1 min'])$$,
    $$VALUES ('hourly'::text, NULL::timestamptz, now()), ('minutely', NULL, now())$$,
    'a new schedule is settled through now: no backfill of its past');
SELECT results_eq('SELECT name, stage, spec, next_tick FROM pepsi.schedules()',
    $$VALUES ('hourly'::text, 's'::text, 'CRON 0 * * * * (UTC)'::text, now() + interval '1 h'),
             ('minutely', 's', 'EVERY 60 s', now() + interval '1 min')$$,
    'schedules() lists them with stage, spec and next tick');

-- A past tick (before registration) is not enqueued; a later one is.
SELECT is_empty($$SELECT * FROM pepsi.fire_schedule('minutely', ARRAY[now() - interval '1 min'], 's')$$,
                'a tick at or before settled_through enqueues nothing');
UPDATE pepsi.schedule_ticks SET settled_through = now() - interval '10 min' WHERE name = 'minutely';
CREATE TEMP TABLE f1 AS
SELECT * FROM pepsi.fire_schedule('minutely',
    ARRAY[now() - interval '2 min', now() - interval '1 min', now() - interval '2 min'], 's',
    '{"job": "tidy"}', 4, NULL, now() + interval '1 min');
SELECT is((SELECT count(*)::int FROM f1), 2, 'two distinct due ticks: two messages');
SELECT results_eq($$SELECT w.stage, w.payload, w.priority, w.state, w.status
                      FROM f1 JOIN pepsi.workqueue w USING (workqueue_id) ORDER BY f1.tick$$,
    $$VALUES ('s'::text, '{"job": "tidy"}'::jsonb, 4, jsonb_build_object('scheduled_for', now() - interval '2 min', 'scheduled_by', 'minutely'), 'pending'::text),
             ('s', '{"job": "tidy"}', 4, jsonb_build_object('scheduled_for', now() - interval '1 min', 'scheduled_by', 'minutely'), 'pending')$$,
    'each carries its stage, payload, priority and state.scheduled_for = its tick, scheduled_by = its name');
SELECT ok((SELECT bool_and(inserted) FROM f1), 'both were inserted');
SELECT results_eq($$SELECT last_tick, settled_through, next_tick FROM pepsi.schedule_ticks WHERE name = 'minutely'$$,
    $$VALUES (now() - interval '1 min', now() - interval '1 min', now() + interval '1 min')$$,
    'the record moves to the latest tick in the same call');
SELECT is_empty($$SELECT * FROM pepsi.fire_schedule('minutely', ARRAY[now() - interval '1 min'], 's')$$,
                'firing the same tick again enqueues nothing');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue WHERE state ? 'scheduled_for'), 2,
          'still exactly one message per tick');

-- An unregistered schedule is created on its first fire, settled from -infinity.
SELECT is((SELECT count(*)::int FROM pepsi.fire_schedule('adhoc', ARRAY[now()], 's')), 1,
          'fire_schedule of an unknown schedule enqueues its tick');
SELECT is((SELECT settled_through FROM pepsi.schedule_ticks WHERE name = 'adhoc'), now(),
          'and records it');

-- A dedupe key: while the last tick's message is live, a tick adds nothing.
CREATE TEMP TABLE d1 AS SELECT * FROM pepsi.fire_schedule('keyed', ARRAY[now() - interval '2 s'], 's', '{}', 0, 'only-one');
CREATE TEMP TABLE d2 AS SELECT * FROM pepsi.fire_schedule('keyed', ARRAY[now() - interval '1 s'], 's', '{}', 0, 'only-one');
SELECT results_eq('SELECT workqueue_id, inserted FROM d2',
    'SELECT workqueue_id, false FROM d1',
    'a tick whose key a live message holds names that message, inserted = false');
SELECT is((SELECT settled_through FROM pepsi.schedule_ticks WHERE name = 'keyed'), now() - interval '1 s',
          'and the tick is settled all the same');

-- Reregistration keeps the ticks; a schedule left out loses its next tick only.
SELECT results_eq($$SELECT name, last_tick FROM pepsi.register_schedules(ARRAY['minutely'], ARRAY['s2'],
        ARRAY['EVERY 30 s'], ARRAY[now() + interval '30 s'])$$,
    $$VALUES ('minutely'::text, now() - interval '1 min')$$, 'registering again keeps the known ticks');
SELECT results_eq($$SELECT name, stage, next_tick FROM pepsi.schedules() WHERE name IN ('hourly', 'minutely')$$,
    $$VALUES ('hourly'::text, 's'::text, NULL::timestamptz), ('minutely', 's2', now() + interval '30 s')$$,
    'a schedule no longer configured keeps its row with next_tick NULL');
SELECT is(jsonb_array_length(pepsi.dashboard_schedules()), 4, 'dashboard_schedules: one element per schedule');

SELECT throws_ok($$SELECT * FROM pepsi.fire_schedule('x y', ARRAY[now()], 's')$$, '22023', NULL,
                 'a malformed schedule name is refused');
SELECT throws_ok($$SELECT * FROM pepsi.fire_schedule('x', ARRAY['infinity'::timestamptz], 's')$$, '22008', NULL,
                 'a non-finite tick is refused');
SELECT throws_ok($$SELECT * FROM pepsi.fire_schedule('x', ARRAY[now()], 's', '[1]')$$, '22023', NULL,
                 'a payload that is not an object is refused');
SELECT throws_ok($$SELECT * FROM pepsi.register_schedules(ARRAY['a'], ARRAY[]::text[], ARRAY['x'], ARRAY[now()])$$,
                 '22023', NULL, 'register_schedules refuses arrays of different lengths');

-- Two replicas fire the same tick at once (real sessions; committed, cleaned up below).
SELECT concat_ws(' ', 'dbname=' || current_database(),
                 nullif('host=' || :'pghost', 'host='), nullif('port=' || :'pgport', 'port='),
                 nullif('user=' || :'pguser', 'user='), nullif('password=' || :'pgpassword', 'password='))
       AS connstr \gset
SELECT dblink_connect('one', :'connstr'), dblink_connect('two', :'connstr');
SELECT (SELECT p FROM dblink('two', 'SELECT pg_backend_pid()') AS x(p int)) AS two_pid \gset
CREATE FUNCTION pg_temp.wait_blocked(pid int) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..1000 LOOP  -- up to 10 s
        IF EXISTS (SELECT FROM pg_stat_activity WHERE pg_stat_activity.pid = wait_blocked.pid
                                                 AND wait_event_type = 'Lock') THEN
            RETURN true;
        END IF;
        PERFORM pg_sleep(0.01);
    END LOOP;
    RETURN false;
END $$;
SELECT dblink_exec('one', 'BEGIN');
SELECT * FROM dblink('one', $$SELECT count(*) FROM pepsi.fire_schedule('race', ARRAY['2026-01-01 00:00:01+00'::timestamptz], 'race')$$) AS x(n bigint);
SELECT dblink_send_query('two', $$SELECT count(*) FROM pepsi.fire_schedule('race', ARRAY['2026-01-01 00:00:01+00'::timestamptz], 'race')$$);
SELECT ok(pg_temp.wait_blocked(:two_pid), 'the second replica waits for the first''s record of the tick');
SELECT dblink_exec('one', 'COMMIT');
SELECT is((SELECT n FROM dblink_get_result('two') AS x(n bigint)), 0::bigint,
          'after the first commits, the second enqueues nothing for that tick');
SELECT * FROM dblink_get_result('two') AS x(n bigint);
SELECT is((SELECT n FROM dblink('one', $$SELECT count(*) FROM pepsi.workqueue WHERE stage = 'race'$$) AS x(n bigint)),
          1::bigint, 'exactly one message for the tick');
-- Again with the schedule's row existing: the lock of the row is what waits.
SELECT dblink_exec('one', 'BEGIN');
SELECT * FROM dblink('one', $$SELECT count(*) FROM pepsi.fire_schedule('race', ARRAY['2026-01-01 00:00:02+00'::timestamptz, '2026-01-01 00:00:03+00'], 'race')$$) AS x(n bigint);
SELECT dblink_send_query('two', $$SELECT count(*) FROM pepsi.fire_schedule('race', ARRAY['2026-01-01 00:00:03+00'::timestamptz], 'race')$$);
SELECT ok(pg_temp.wait_blocked(:two_pid), 'a replica firing a later tick waits for the row too');
SELECT dblink_exec('one', 'COMMIT');
SELECT is((SELECT n FROM dblink_get_result('two') AS x(n bigint)), 0::bigint,
          'and finds that tick settled');
SELECT * FROM dblink_get_result('two') AS x(n bigint);
SELECT results_eq($$SELECT t FROM dblink('one', 'SELECT (state->>''scheduled_for'')::timestamptz FROM pepsi.workqueue WHERE stage = ''race'' ORDER BY 1') AS x(t timestamptz)$$,
    $$VALUES ('2026-01-01 00:00:01+00'::timestamptz), ('2026-01-01 00:00:02+00'), ('2026-01-01 00:00:03+00')$$,
    'one message per tick, none doubled, none missing');
SELECT is((SELECT n FROM dblink('one', $$SELECT count(*) FROM pepsi.schedule_ticks WHERE name = 'race'$$) AS x(n bigint)),
          1::bigint, 'one record for the schedule');
SELECT dblink_exec('one', $$DELETE FROM pepsi.workqueue WHERE stage = 'race'$$);
SELECT dblink_exec('one', $$DELETE FROM pepsi.schedule_ticks WHERE name = 'race'$$);
SELECT dblink_disconnect('one'), dblink_disconnect('two');

SELECT * FROM finish();
ROLLBACK;
