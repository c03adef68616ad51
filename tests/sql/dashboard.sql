-- pepsi-httpd's functions: heartbeat v3 gauges, dashboard_snapshot,
-- dashboard_failed, dashboard_message and the dashboard's buttons.
BEGIN;
SELECT plan(31);

-- Role and privileges.
SELECT has_role('pepsi_dashboard', 'the pepsi_dashboard role exists');
SELECT ok(NOT (SELECT rolcanlogin FROM pg_roles WHERE rolname = 'pepsi_dashboard'),
          'pepsi_dashboard is a NOLOGIN group role');
SELECT ok(has_function_privilege('pepsi_dashboard', 'pepsi.dashboard_snapshot(interval)', 'EXECUTE')
      AND has_function_privilege('pepsi_dashboard', 'pepsi.dashboard_message(bigint)', 'EXECUTE')
      AND has_function_privilege('pepsi_dashboard', 'pepsi.dashboard_cancel(bigint[])', 'EXECUTE'),
          'pepsi_dashboard executes the dashboard functions');
SELECT ok(NOT has_table_privilege('pepsi_dashboard', 'pepsi.workqueue', 'SELECT')
      AND NOT has_function_privilege('pepsi_dashboard', 'pepsi.claim(bigint, text[], integer[], boolean, bigint[])', 'EXECUTE')
      AND NOT has_function_privilege('pepsi_dashboard', 'pepsi.requeue_failed(text, bigint[])', 'EXECUTE'),
          'pepsi_dashboard reads no table and cannot claim or call requeue_failed directly');
SELECT ok(NOT has_function_privilege('pepsi_stage', 'pepsi.dashboard_snapshot(interval)', 'EXECUTE')
      AND NOT has_function_privilege('public', 'pepsi.pause_stage(text, boolean)', 'EXECUTE'),
          'other roles cannot call the dashboard functions');
SELECT ok(has_function_privilege('pepsi_dispatcher', 'pepsi.heartbeat(bigint, jsonb)', 'EXECUTE'),
          'pepsi_dispatcher executes heartbeat v3');

-- heartbeat v3: gauges stored; NULL keeps them.
SELECT pepsi.register_dispatcher('h', 1, false) AS d \gset
SELECT lives_ok(format('SELECT pepsi.heartbeat(%s)', :d), 'the one-argument heartbeat still works');
SELECT is((SELECT gauges FROM pepsi.dispatchers WHERE dispatcher_id = :d), NULL, 'no gauges yet');
SELECT pepsi.heartbeat(:d, '{"heartbeat_interval": 1, "inflight": 3}');
SELECT is((SELECT gauges ->> 'inflight' FROM pepsi.dispatchers WHERE dispatcher_id = :d), '3',
          'gauges are stored');
SELECT pepsi.heartbeat(:d);
SELECT is((SELECT gauges ->> 'inflight' FROM pepsi.dispatchers WHERE dispatcher_id = :d), '3',
          'a heartbeat without gauges keeps the last ones');

-- Rows to look at.
CREATE FUNCTION pg_temp.row_with(s text, st text, state jsonb, age interval DEFAULT '0') RETURNS bigint
LANGUAGE sql AS $$
    INSERT INTO pepsi.workqueue (stage, status, state, timeout, updated_at)
    VALUES (s, st, state, CASE WHEN st = 'paused' THEN now() - interval '1 s' END, now() - age)
    RETURNING workqueue_id $$;
SELECT pg_temp.row_with('a', 'pending', '{}', '100 s') AS p1,
       pg_temp.row_with('a', 'pending', '{}', '10 s') AS p2,
       pg_temp.row_with('a', 'paused', '{}') AS z,
       pg_temp.row_with('b', 'failed', '{"error": "boom"}') AS f1,
       pg_temp.row_with('b', 'failed', '{"error": "boom"}') AS f2,
       pg_temp.row_with('b', 'timeout', '{"dispatch_error": "timeout after 1 s"}') AS t,
       pg_temp.row_with('b', 'done', '{}') AS dn \gset
INSERT INTO pepsi.stage_stats (stage, processed, failed) VALUES ('a', 5, 2);

SELECT pepsi.dashboard_snapshot() AS snap \gset
SELECT is((:'snap'::jsonb -> 'queue') @> '[{"stage": "a", "status": "pending", "count": 2}]', true,
          'snapshot: queue depth by stage and status');
SELECT ok((:'snap'::jsonb -> 'oldest_pending' ->> 'a')::float8 BETWEEN 99 AND 200,
          'snapshot: oldest pending age of the stage (by updated_at)');
SELECT is(:'snap'::jsonb -> 'retries_due' ->> 'a', '1', 'snapshot: paused rows due');
SELECT is(:'snap'::jsonb -> 'stage_stats' -> 0 ->> 'processed', '5', 'snapshot: stage stats');
SELECT ok(:'snap'::jsonb -> 'totals' ? 'stage_runs', 'snapshot: global totals');
SELECT is(:'snap'::jsonb -> 'dispatchers' -> 0 ->> 'live', 'true', 'snapshot: a fresh heartbeat is live');
SELECT is(:'snap'::jsonb -> 'failure_reasons' -> 0,
          jsonb_build_object('stage', 'b', 'reason', 'boom', 'count', 2, 'newest_id', :f2,
                             'raw', jsonb_build_array(jsonb_build_object('reason', 'boom', 'count', 2))),
          'snapshot: failures grouped by reason, largest group first');
SELECT pg_advisory_unlock(1885629558, (:d & 2147483647)::int);
SELECT is(pepsi.dashboard_snapshot() -> 'dispatchers', '[]'::jsonb,
          'a dispatcher whose session is gone is not listed (v4: liveness by session)');

-- dashboard_failed / dashboard_message.
SELECT results_eq($$SELECT workqueue_id FROM pepsi.dashboard_failed('boom')$$,
                  format('VALUES (%s::bigint), (%s)', :f2, :f1), 'failed messages of one reason, newest first');
SELECT is((SELECT error FROM pepsi.dashboard_failed(NULL, 'b') WHERE workqueue_id = :t),
          'timeout after 1 s', 'dispatch_error is the reason when there is one');
SELECT is(pepsi.dashboard_message(:f1) ->> 'status', 'failed', 'one message: its row');
SELECT ok(pepsi.dashboard_message(:f1) ? 'age_seconds', 'one message: its ages');
SELECT is(pepsi.dashboard_message(-1), NULL, 'no such message: NULL');

-- Buttons.
SELECT is(pepsi.dashboard_requeue(ARRAY[:f1, :dn]::bigint[]), 1, 'requeue moves the failed row, not the done one');
SELECT is(pepsi.dashboard_requeue('{}'), 0, 'requeue of no ids moves nothing');
SELECT is(pepsi.dashboard_cancel(ARRAY[:p1, :z, :f2]::bigint[]), 2, 'cancel takes pending and paused rows');
SELECT results_eq(format('SELECT status, state ->> ''error'', timeout FROM pepsi.workqueue WHERE workqueue_id = %s', :z),
    $$VALUES ('failed'::text, 'cancelled by operator'::text, NULL::timestamptz)$$,
    'a cancelled row is failed, cancelled by operator');
SELECT pepsi.register_stages(:d, ARRAY['a'], NULL, NULL, NULL, NULL, NULL, NULL);
SELECT is(pepsi.pause_stage('a', true), true, 'pause a stage');
SELECT is((SELECT value FROM pepsi.config WHERE section = 'stage-a' AND option = 'PAUSED'), 'yes',
          'a paused stage is an overlay row');
SELECT is(pepsi.pause_stage('a', false), true, 'resume removes it');
SELECT throws_ok($$SELECT pepsi.pause_stage('a b', true)$$, '22023', NULL,
                 'an invalid stage name is refused');

SELECT * FROM finish();
ROLLBACK;
