-- record_dispatch_error and check_answered: the dispatcher's verdicts,
-- guarded so a row the stage already moved is never clobbered.
BEGIN;
SELECT plan(17);

CREATE FUNCTION pg_temp.running(s text, d bigint) RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO pepsi.workqueue (stage, status, dispatcher_id, state)
    VALUES (s, 'running', d, '{"note": 1}') RETURNING workqueue_id $$;

SELECT pg_temp.running('s', 1) AS crashed, pg_temp.running('s', 1) AS slow,
       pg_temp.running('s', 1) AS moved, pg_temp.running('s', 2) AS other \gset
SELECT pepsi.advance(:moved, 's', 't', 1);

SELECT is((SELECT count(*)::int FROM pepsi.record_dispatch_error(1,
              ARRAY[:crashed, :slow, :moved, :other]::bigint[],
              ARRAY['failed', 'timeout', 'failed', 'failed'],
              ARRAY['worker killed by signal 9', 'timeout after 300 s', 'x', 'y'])),
          2, 'record_dispatch_error changes only running rows the caller holds');
SELECT results_eq(format('SELECT status, dispatcher_id, state FROM pepsi.workqueue WHERE workqueue_id = %s', :crashed),
    $$VALUES ('failed'::text, NULL::bigint, '{"note": 1, "dispatch_error": "worker killed by signal 9"}'::jsonb)$$,
    'a crashed row is failed with dispatch_error, its state kept');
SELECT results_eq(format('SELECT status, state->>''dispatch_error'' FROM pepsi.workqueue WHERE workqueue_id = %s', :slow),
    $$VALUES ('timeout'::text, 'timeout after 300 s'::text)$$, 'a slow row gets status timeout');
SELECT results_eq(format('SELECT stage, status, state FROM pepsi.workqueue WHERE workqueue_id = %s', :moved),
    $$VALUES ('t'::text, 'pending'::text, '{"note": 1}'::jsonb)$$,
    'a row the stage already advanced is never touched');
SELECT results_eq(format('SELECT status, dispatcher_id, state FROM pepsi.workqueue WHERE workqueue_id = %s', :other),
    $$VALUES ('running'::text, 2::bigint, '{"note": 1}'::jsonb)$$,
    'a row another dispatcher holds is never touched');
SELECT is((SELECT count(*)::int FROM pepsi.record_dispatch_error(1, ARRAY[:crashed]::bigint[], ARRAY['failed'], ARRAY['again'])),
          0, 'a row already failed is not written twice');
SELECT is((SELECT state->>'dispatch_error' FROM pepsi.workqueue WHERE workqueue_id = :crashed),
          'worker killed by signal 9', 'the first verdict stays');
SELECT throws_ok(format($$SELECT pepsi.record_dispatch_error(2, ARRAY[%s]::bigint[], ARRAY['done'], ARRAY['x'])$$, :other),
                 '22023', NULL, 'a status other than failed/timeout is refused');
SELECT throws_ok(format($$SELECT pepsi.record_dispatch_error(2, ARRAY[%s]::bigint[], ARRAY[NULL::text], ARRAY['x'])$$, :other),
                 '22023', NULL, 'a NULL status is refused');
SELECT throws_ok(format($$SELECT pepsi.record_dispatch_error(2, ARRAY[%s]::bigint[], ARRAY['failed', 'failed'], ARRAY['x'])$$, :other),
                 '22023', NULL, 'arrays of different lengths are refused');
SELECT is((SELECT count(*)::int FROM pepsi.record_dispatch_error(2, ARRAY[]::bigint[], ARRAY[]::text[], ARRAY[]::text[])), 0,
          'empty arrays change nothing');
SELECT is((SELECT count(*)::int FROM pepsi.record_dispatch_error(NULL, ARRAY[:other]::bigint[], ARRAY['failed'], ARRAY['x'])), 0,
          'a NULL dispatcher changes nothing');

-- check_answered: '0' answered but the row is still running.
SELECT pg_temp.running('c', 5) AS lazy, pg_temp.running('c', 5) AS good \gset
SELECT pepsi.finish(:good, 'c', 5);
SELECT results_eq(format('SELECT workqueue_id, stage FROM pepsi.check_answered(5, ARRAY[%s, %s, %s]::bigint[])', :lazy, :good, :other),
    format($$VALUES (%s::bigint, 'c'::text)$$, :lazy),
    'check_answered returns only rows the stage left running');
SELECT results_eq(format('SELECT status, state->>''dispatch_error'' FROM pepsi.workqueue WHERE workqueue_id = %s', :lazy),
    $$VALUES ('failed'::text, 'stage answered 0 but left the row running'::text)$$,
    'such a row is failed with a dispatch_error saying so');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :good), 'done',
          'a row the stage finished is untouched');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :other), 'running',
          'another dispatcher''s row is untouched');
SELECT is_empty('SELECT * FROM pepsi.check_answered(5, NULL)', 'check_answered of NULL ids does nothing');

SELECT * FROM finish();
ROLLBACK;
