-- A row whose state is near the jsonb size limit (255 MB)
-- cannot take a note (`state || '{"dispatch_error": ...}'` raises 54000).
-- record_dispatch_error v4, check_answered v3 and requeue_due v4 still take
-- it out of the way, its state untouched, and write the note on the other
-- rows of the same call.
BEGIN;
SELECT plan(19);

-- One big state, built once (about 3 s); each row below copies it.
CREATE TEMP TABLE big AS
SELECT jsonb_build_object('big', repeat('x', 268435420)) AS s;
SELECT throws_ok($$SELECT s || '{"dispatch_error": "x"}' FROM big$$, '54000', NULL,
                 'the fixture: this state cannot take a dispatch_error');

CREATE FUNCTION pg_temp.row(st text, stg text, d bigint, n int, huge boolean)
RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO pepsi.workqueue (stage, status, dispatcher_id, retries, timeout, state)
    SELECT stg, st, d, n, CASE WHEN st = 'paused' THEN now() - interval '1 s' END,
           CASE WHEN huge THEN big.s ELSE '{"note": 1}' END
      FROM big RETURNING workqueue_id $$;
-- The state kept as stored: the same compressed datum (pg_column_size reads
-- only the TOAST pointer; reading the 255 MB value takes about a second, so
-- the full comparison is made once, for big1).
CREATE FUNCTION pg_temp.kept(id bigint) RETURNS boolean LANGUAGE sql AS $$
    SELECT pg_column_size(w.state) = (SELECT pg_column_size(big.s) FROM big)
      FROM pepsi.workqueue AS w WHERE w.workqueue_id = id $$;

-- r: automatic retries (RETRY_DELAY 10 s, MAX_RETRIES 3).
SELECT pepsi.register_stages(1, ARRAY['r'], NULL, ARRAY[3], ARRAY[interval '10 s'],
                             NULL, NULL, NULL);

-- record_dispatch_error: a big row and a normal one in the same call.
SELECT pg_temp.row('running', 's', 1, 0, true) AS big1,
       pg_temp.row('running', 's', 1, 0, false) AS small1,
       pg_temp.row('running', 'r', 1, 0, true) AS bigretry \gset
SELECT lives_ok(format($$CREATE TEMP TABLE v1 AS SELECT * FROM pepsi.record_dispatch_error(1,
                 ARRAY[%s, %s, %s]::bigint[], ARRAY['failed', 'timeout', 'failed'],
                 ARRAY['worker killed by signal 9', 'timeout after 300 s', '1 boom'])$$,
                 :big1, :small1, :bigretry),
                'record_dispatch_error does not fail on a row whose state cannot take the note');
SELECT results_eq('SELECT workqueue_id, status FROM v1 ORDER BY workqueue_id',
    format($$VALUES (%s::bigint, 'failed'::text), (%s, 'timeout'), (%s, 'paused')$$,
           :big1, :small1, :bigretry),
    'it returns every row it changed, the big ones included');
SELECT results_eq(format('SELECT status, dispatcher_id FROM pepsi.workqueue WHERE workqueue_id = %s', :big1),
    $$VALUES ('failed'::text, NULL::bigint)$$, 'the big row is failed, its dispatcher cleared');
SELECT ok((SELECT w.state = big.s FROM pepsi.workqueue AS w, big WHERE w.workqueue_id = :big1),
          'its state is untouched (no dispatch_error, the payload kept)');
SELECT results_eq(format('SELECT status, dispatcher_id, state FROM pepsi.workqueue WHERE workqueue_id = %s', :small1),
    $$VALUES ('timeout'::text, NULL::bigint, '{"note": 1, "dispatch_error": "timeout after 300 s"}'::jsonb)$$,
    'the normal row of the same call gets its dispatch_error');
SELECT results_eq(format($$SELECT status, dispatcher_id, timeout > now() FROM pepsi.workqueue WHERE workqueue_id = %s$$, :bigretry),
    $$VALUES ('paused'::text, NULL::bigint, true)$$,
    'a big row with retries left is paused for its automatic retry');
SELECT ok(pg_temp.kept(:bigretry), 'its state is untouched (no retry_error)');

-- The normal path, alone, still writes the note.
SELECT pg_temp.row('running', 's', 1, 0, false) AS small2 \gset
SELECT is((SELECT count(*)::int FROM pepsi.record_dispatch_error(1, ARRAY[:small2]::bigint[],
              ARRAY['failed'], ARRAY['2 no'])), 1, 'the normal path changes the row');
SELECT is((SELECT state FROM pepsi.workqueue WHERE workqueue_id = :small2),
          '{"note": 1, "dispatch_error": "2 no"}'::jsonb, 'and writes its dispatch_error');

-- check_answered: '0' answered but the big row is still running.
SELECT pg_temp.row('running', 'c', 5, 0, true) AS big2,
       pg_temp.row('running', 'c', 5, 0, false) AS small3 \gset
SELECT lives_ok(format($$CREATE TEMP TABLE v2 AS SELECT * FROM pepsi.check_answered(5, ARRAY[%s, %s]::bigint[])$$,
                       :big2, :small3),
                'check_answered does not fail on a row whose state cannot take the note');
SELECT results_eq('SELECT workqueue_id FROM v2 ORDER BY workqueue_id',
    format('VALUES (%s::bigint), (%s)', :big2, :small3), 'it returns both rows');
SELECT results_eq(format('SELECT status, dispatcher_id FROM pepsi.workqueue WHERE workqueue_id = %s', :big2),
    $$VALUES ('failed'::text, NULL::bigint)$$, 'the big row is failed, its dispatcher cleared');
SELECT ok(pg_temp.kept(:big2), 'its state is untouched');
SELECT is((SELECT state->>'dispatch_error' FROM pepsi.workqueue WHERE workqueue_id = :small3),
          'stage answered 0 but left the row running', 'the normal row gets its dispatch_error');

-- requeue_due: a due big row whose retries are used up (bigretry above is
-- not due for another 8 s at least).
SELECT pg_temp.row('paused', 'q', NULL, 3, true) AS big3,
       pg_temp.row('paused', 'q', NULL, 3, false) AS small4,
       pg_temp.row('paused', 'q', NULL, 0, false) AS small5 \gset
SELECT results_eq($$SELECT requeued, exhausted, exhausted_stages, exhausted_counts
                     FROM pepsi.requeue_due(ARRAY['q'], ARRAY[3], NULL, NULL)$$,
    $$VALUES (1, 2, ARRAY['q'], ARRAY[2])$$,
    'requeue_due does not fail on a row whose state cannot take the note, and counts it');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :big3), 'failed',
          'the big row is failed (retries exhausted)');
SELECT ok(pg_temp.kept(:big3), 'its state is untouched');
SELECT results_eq(format($$SELECT w.workqueue_id, w.status, w.state->>'dispatch_error' FROM pepsi.workqueue AS w
                           WHERE w.workqueue_id IN (%s, %s) ORDER BY 1$$, :small4, :small5),
    format($$VALUES (%s::bigint, 'failed'::text, 'retries exhausted'::text), (%s, 'pending', NULL)$$,
           :small4, :small5),
    'the other due rows move as before, with their note');

SELECT * FROM finish();
ROLLBACK;
