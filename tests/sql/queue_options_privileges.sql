-- Who may use priorities, dedupe keys, schedules and reschedule.
BEGIN;
SELECT plan(18);

SELECT pepsi.enqueue('s', '{}', now() + interval '1 h') AS waiting \gset

SET LOCAL ROLE pepsi_ingress;
SELECT ok(pepsi.enqueue('s', '{}', priority => 2, dedupe_key => 'ingress-k') > 0,
          'ingress can enqueue with a priority and a key');
SELECT is((SELECT count(*)::int FROM pepsi.enqueue_many('s', ARRAY['{}']::jsonb[], NULL, 1, ARRAY['ingress-m'])),
          1, 'ingress can enqueue_many with a priority and keys');
SELECT throws_ok(format('SELECT pepsi.reschedule(%s)', :waiting), '42501', NULL, 'ingress cannot reschedule');
SELECT throws_ok($$SELECT * FROM pepsi.fire_schedule('x', ARRAY[now()], 's')$$, '42501', NULL,
                 'ingress cannot fire a schedule');
RESET ROLE;

SET LOCAL ROLE pepsi_stage;
SELECT ok(pepsi.enqueue('s', '{}', priority => -1, dedupe_key => 'stage-k') > 0,
          'a stage can enqueue with a priority and a key');
SELECT throws_ok(format('SELECT pepsi.reschedule(%s)', :waiting), '42501', NULL, 'a stage cannot reschedule');
RESET ROLE;

SET LOCAL ROLE pepsi_dispatcher;
SELECT is(pepsi.reschedule(:waiting, now() + interval '2 h'), now() + interval '2 h',
          'the dispatcher''s role (operators) can reschedule');
SELECT is((SELECT count(*)::int FROM pepsi.register_schedules(ARRAY['n'], ARRAY['s'], ARRAY['EVERY 1 s'],
                                                              ARRAY[now()])), 1,
          'the dispatcher can register schedules');
SELECT is((SELECT count(*)::int FROM pepsi.fire_schedule('n', ARRAY[now() + interval '1 s'], 's')), 1,
          'the dispatcher can fire a schedule');
SELECT is((SELECT count(*)::int FROM pepsi.schedules()), 1, 'and list them');
RESET ROLE;

SET LOCAL ROLE pepsi_operator;
SELECT ok(pepsi.enqueue('s', '{}', priority => 1, dedupe_key => 'operator-k') > 0,
          'an operator can enqueue with a priority and a key');
SELECT is(pepsi.reschedule(:waiting, now() + interval '3 h'), now() + interval '3 h',
          'an operator can reschedule');
SELECT is((SELECT count(*)::int FROM pepsi.schedules()), 1, 'an operator can list the schedules');
SELECT is((SELECT count(*)::int FROM pepsi.schedule_ticks), 1, 'and read their table');
SELECT throws_ok($$SELECT * FROM pepsi.fire_schedule('n', ARRAY[now() + interval '2 s'], 's')$$, '42501', NULL,
                 'an operator cannot fire a schedule');
RESET ROLE;

SET LOCAL ROLE pepsi_dashboard;
SELECT is(pepsi.dashboard_reschedule(:waiting), now(), 'the dashboard can reschedule through its function');
SELECT is(jsonb_array_length(pepsi.dashboard_schedules()), 1, 'the dashboard can list the schedules');
SELECT throws_ok(format('SELECT pepsi.reschedule(%s)', :waiting), '42501', NULL,
                 'but not call reschedule itself');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
