-- Migration 0012: queue_overview v2 (live workers per stage from the
-- dispatchers' heartbeat gauges), dashboard_cancel v2 (delegates to
-- pepsi.cancel) and dashboard_requeue v2 (requeue_failed notifies).
BEGIN;
SELECT plan(19);

-- queue_overview v2: live workers per stage, summed over live dispatchers.
SELECT pepsi.register_stages(1, ARRAY['a'], NULL, ARRAY[4], NULL, NULL, ARRAY[3], ARRAY[2]);
SELECT pepsi.register_dispatcher('h1', 1, false) AS d1 \gset
SELECT pepsi.register_dispatcher('h2', 2, true) AS d2 \gset
SELECT pepsi.register_dispatcher('h3', 3, true) AS d3 \gset
SELECT pepsi.register_dispatcher('h4', 4, true) AS d4 \gset
SELECT pepsi.heartbeat(:d1, '{"heartbeat_interval": 1,
    "workers": {"a": {"busy": 2, "idle": 1, "retiring": 0, "stopping": 0},
                "b": {"busy": 0, "idle": 0, "retiring": 1, "stopping": 1}}}');
SELECT pepsi.heartbeat(:d2, '{"heartbeat_interval": 5,
    "workers": {"a": {"busy": 1, "idle": 0, "retiring": 0, "stopping": 0}}}');
-- Killed (its session, and the liveness lock it held, are gone): not live,
-- however fresh its heartbeat (queue_overview v3: liveness by session).
SELECT pepsi.heartbeat(:d3, '{"heartbeat_interval": 2,
    "workers": {"a": {"busy": 7, "idle": 7, "retiring": 7, "stopping": 7}, "c": {"busy": 1}}}');
CREATE FUNCTION pg_temp.kill(d bigint) RETURNS boolean LANGUAGE sql AS $$
    SELECT pg_advisory_unlock(1885629558, (d & 2147483647)::int) $$;
SELECT pg_temp.kill(:d3);
-- A dispatcher without gauges (an older one) adds nothing.
SELECT pepsi.heartbeat(:d4);

SELECT results_eq($$SELECT stage, dispatchers, workers, workers_busy, workers_idle,
                           workers_retiring, workers_stopping FROM pepsi.queue_overview()$$,
    $$VALUES ('a'::text, 2::bigint, 4::bigint, 3::bigint, 1::bigint, 0::bigint, 0::bigint),
             ('b', 1, 2, 0, 0, 1, 1)$$,
    'queue_overview: workers by state summed over live dispatchers; a stage with workers only is listed');
SELECT results_eq($$SELECT registered, parallelism, queue_limit, pending FROM pepsi.queue_overview()
                     WHERE stage = 'a'$$,
    $$VALUES (true, 3, 2, 0::bigint)$$, 'queue_overview v2 keeps the registry columns');
SELECT is((SELECT count(*)::int FROM pepsi.queue_overview() WHERE stage = 'c'), 0,
          'a stage only a killed dispatcher reports is not listed');

-- Liveness is the session's, not the heartbeat's age.
UPDATE pepsi.dispatchers SET heartbeat_at = now() - interval '11 s' WHERE dispatcher_id = :d1;
SELECT is((SELECT workers FROM pepsi.queue_overview() WHERE stage = 'a'), 4::bigint,
          'a heartbeat older than 3 × its interval still counts while its session is there');
SELECT pg_temp.kill(:d1);
SELECT results_eq($$SELECT stage, dispatchers, workers, workers_busy FROM pepsi.queue_overview()$$,
    $$VALUES ('a'::text, 1::bigint, 1::bigint, 1::bigint)$$,
    'a dispatcher whose session is gone no longer counts');
SELECT pg_temp.kill(:d2);
SELECT results_eq($$SELECT stage, dispatchers, workers FROM pepsi.queue_overview()$$,
    $$VALUES ('a'::text, 0::bigint, 0::bigint)$$,
    'a registered stage without live workers shows 0');
-- Gauges without an interval: the same rule.
UPDATE pepsi.dispatchers SET gauges = '{"workers": {"a": {"idle": 2}}}',
                             heartbeat_at = now() - interval '6 min' WHERE dispatcher_id = :d4;
SELECT is((SELECT workers_idle FROM pepsi.queue_overview() WHERE stage = 'a'), 2::bigint,
          'gauges without heartbeat_interval count while the session is there');
SELECT pg_temp.kill(:d4);
SELECT is((SELECT workers FROM pepsi.queue_overview() WHERE stage = 'a'), 0::bigint,
          'and not after');
SELECT pepsi.heartbeat(:d4);
SELECT pepsi.heartbeat(:d2);
UPDATE pepsi.dispatchers SET gauges = '{"heartbeat_interval": 1, "workers": [1]}',
                             heartbeat_at = now() WHERE dispatcher_id = :d4;
UPDATE pepsi.dispatchers SET gauges = '{"heartbeat_interval": 1, "workers": {"a": 3}}',
                             heartbeat_at = now() WHERE dispatcher_id = :d2;
SELECT lives_ok('SELECT * FROM pepsi.queue_overview()',
                'gauges of another shape are ignored, not an error');

-- Grants of the new result type: operators yes, stage programs and the dashboard no.
SELECT ok(has_function_privilege('pepsi_dispatcher', 'pepsi.queue_overview()', 'EXECUTE')
      AND NOT has_function_privilege('pepsi_stage', 'pepsi.queue_overview()', 'EXECUTE')
      AND NOT has_function_privilege('pepsi_ingress', 'pepsi.queue_overview()', 'EXECUTE')
      AND NOT has_function_privilege('public', 'pepsi.queue_overview()', 'EXECUTE'),
          'queue_overview v2 is granted to pepsi_dispatcher only');

-- dashboard_cancel v2 is pepsi.cancel: same rows, same state.
CREATE FUNCTION pg_temp.row_with(s text, st text, state jsonb DEFAULT '{}') RETURNS bigint
LANGUAGE sql AS $$
    INSERT INTO pepsi.workqueue (stage, status, state, timeout, dispatcher_id)
    VALUES (s, st, state, CASE WHEN st = 'paused' THEN now() + interval '1 h' END,
            CASE WHEN st = 'running' THEN (SELECT min(dispatcher_id) FROM pepsi.dispatchers) END)
    RETURNING workqueue_id $$;
SELECT pg_temp.row_with('a', 'pending') AS p,
       pg_temp.row_with('a', 'running') AS r,
       pg_temp.row_with('a', 'done') AS dn,
       pg_temp.row_with('a', 'failed', '{"error": "boom"}') AS f \gset
SELECT pepsi.enqueue('a', '{}', now() + interval '1 h') AS delayed \gset
SELECT pg_temp.row_with('a', 'pending') AS p2, pg_temp.row_with('a', 'paused') AS z2 \gset

SELECT is(pepsi.dashboard_cancel(ARRAY[:p, :r, :dn, :f, :delayed]::bigint[]), 2,
          'dashboard_cancel takes the pending and the delayed row, not running or terminal ones');
SELECT is(pepsi.cancel(ARRAY[:p2, :z2]::bigint[]), 2, 'pepsi.cancel of a pending and a paused row');
SELECT results_eq(format($$SELECT status, state - 'cancelled_status', timeout,
                                  state ->> 'cancelled_status'
                             FROM pepsi.workqueue WHERE workqueue_id IN (%s, %s) ORDER BY workqueue_id$$,
                         :p, :p2),
    $$VALUES ('failed'::text, '{"error": "cancelled by operator"}'::jsonb, NULL::timestamptz, 'pending'::text),
             ('failed', '{"error": "cancelled by operator"}', NULL, 'pending')$$,
    'a row cancelled from the dashboard looks like one cancelled by pepsi.cancel');
SELECT results_eq(format($$SELECT state ? 'delayed_until', state ->> 'cancelled_status'
                             FROM pepsi.workqueue WHERE workqueue_id = %s$$, :delayed),
    $$VALUES (false, 'paused'::text)$$,
    'a delayed row cancelled from the dashboard loses delayed_until, as with pepsi.cancel');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :r), 'running',
          'a running row is never cancelled');
SELECT is(pepsi.dashboard_cancel('{}'), 0, 'dashboard_cancel of no ids cancels nothing');
SELECT is(pepsi.dashboard_cancel(NULL), 0, 'dashboard_cancel of NULL cancels nothing (never all)');

-- dashboard_requeue v2: requeue_failed's rule and its notification only.
SELECT is(pepsi.dashboard_requeue(NULL), 0, 'dashboard_requeue of NULL moves nothing (never all)');
SELECT is(pepsi.dashboard_requeue(ARRAY[:f, :dn, :p]::bigint[]), 2,
          'dashboard_requeue moves the failed and the cancelled row, not the done one');

SELECT * FROM finish();
ROLLBACK;
