-- pepsi.requeue_failed: the operator gives failed rows another go.
BEGIN;
SELECT plan(9);

CREATE FUNCTION pg_temp.row_with(s text, st text, state jsonb) RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO pepsi.workqueue (stage, status, state, retries)
    VALUES (s, st, state, 4) RETURNING workqueue_id $$;
SELECT pg_temp.row_with('a', 'failed', '{"error": "boom", "keep": 1}') AS f,
       pg_temp.row_with('a', 'timeout', '{"dispatch_error": "timeout after 300 s"}') AS t,
       pg_temp.row_with('b', 'expired', '{"dispatch_error": "expired"}') AS e,
       pg_temp.row_with('b', 'failed', '{}') AS f2,
       pg_temp.row_with('a', 'done', '{}') AS d \gset

SELECT is(pepsi.requeue_failed('a'), 2, 'requeue by stage takes failed and timeout rows of it');
SELECT results_eq(format('SELECT status, retries, state FROM pepsi.workqueue WHERE workqueue_id = %s', :f),
    $$VALUES ('pending'::text, 0, '{"keep": 1, "previous_error": {"status": "failed", "error": "boom"}}'::jsonb)$$,
    'a requeued row is pending with retries 0 and its error kept under previous_error');
SELECT is((SELECT state FROM pepsi.workqueue WHERE workqueue_id = :t),
          '{"previous_error": {"status": "timeout", "dispatch_error": "timeout after 300 s"}}'::jsonb,
          'dispatch_error moves under previous_error too');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :e), 'expired',
          'rows of other stages stay');
SELECT is(pepsi.requeue_failed(NULL, ARRAY[:e]::bigint[]), 1, 'requeue by id');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :e), 'pending', 'an expired row can be requeued');
SELECT is(pepsi.requeue_failed(NULL, ARRAY[:d]::bigint[]), 0, 'a done row is never requeued');
SELECT is(pepsi.requeue_failed('a', ARRAY[:f2]::bigint[]), 0, 'stage and ids must both match');
SELECT is(pepsi.requeue_failed(), 1, 'no filter: every failed row');

SELECT * FROM finish();
ROLLBACK;
