-- advance_many (migration 0015): pepsi.advance for a batch in one UPDATE.
-- Only rows 'running' at from_stage (and held by dispatcher_id when given)
-- move on; the others are left alone and not returned; to_stage is checked
-- as advance checks it, even when no row applies; pepsi_stage may call it.
BEGIN;
SELECT plan(20);

-- A running row of stage s held by dispatcher d, with some history.
CREATE FUNCTION pg_temp.running(s text, d bigint) RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO pepsi.workqueue (stage, status, dispatcher_id, retries, state)
    VALUES (s, 'running', d, 2, '{"k": "v"}') RETURNING workqueue_id $$;
CREATE FUNCTION pg_temp.row_of(i bigint) RETURNS TABLE (stage text, status text, retries int,
    dispatcher_id bigint, timeout timestamptz, state jsonb) LANGUAGE sql AS $$
    SELECT stage, status, retries, dispatcher_id, timeout, state
      FROM pepsi.workqueue WHERE workqueue_id = i $$;

SELECT pg_temp.running('fetch', 7) AS a1, pg_temp.running('fetch', 7) AS a2,
       pg_temp.running('fetch', 7) AS a3, pg_temp.running('fetch', 8) AS theirs,
       pg_temp.running('parse', 7) AS elsewhere, pg_temp.running('fetch', 7) AS anyholder
\gset
SELECT pepsi.enqueue('fetch') AS pend \gset
SELECT pg_temp.running('fetch', 7) AS fin \gset
SELECT pepsi.finish(:fin, 'fetch', 7);

-- to_stage is checked first, whatever the ids
SELECT throws_ok(format('SELECT * FROM pepsi.advance_many(ARRAY[%s]::bigint[], %L, %L, 7)',
                        :a1, 'fetch', 'st ore'), '22023', NULL,
                 'advance_many refuses a bad to_stage name');
SELECT throws_ok(format('SELECT * FROM pepsi.advance_many(ARRAY[%s]::bigint[], %L, NULL, 7)',
                        :a1, 'fetch'), '22023', NULL, 'advance_many refuses a NULL to_stage');
SELECT throws_ok($$SELECT * FROM pepsi.advance_many(ARRAY[]::bigint[], 'fetch', 'st ore')$$,
                 '22023', NULL, 'a bad to_stage raises even for no ids');
SELECT throws_ok($$SELECT * FROM pepsi.advance_many(ARRAY[-1]::bigint[], 'fetch', NULL)$$,
                 '22023', NULL, 'a NULL to_stage raises even when no row applies');
SELECT results_eq(format('SELECT * FROM pg_temp.row_of(%s)', :a1),
    $$VALUES ('fetch'::text, 'running'::text, 2, 7::bigint, NULL::timestamptz, '{"k": "v"}'::jsonb)$$,
    'a refused call left the row as it was');

-- nothing to do
SELECT is_empty($$SELECT * FROM pepsi.advance_many(ARRAY[]::bigint[], 'fetch', 'store', 7)$$,
                'no ids: nothing returned');
SELECT is_empty($$SELECT * FROM pepsi.advance_many(NULL, 'fetch', 'store', 7)$$,
                'NULL ids: nothing returned');
SELECT is_empty(format('SELECT * FROM pepsi.advance_many(ARRAY[%s, %s]::bigint[], %L, %L, 9)',
                       :a1, :a2, 'fetch', 'store'),
                'a wrong dispatcher advances nothing');
SELECT is_empty(format('SELECT * FROM pepsi.advance_many(ARRAY[%s, %s]::bigint[], NULL, %L, 7)',
                       :a1, :a2, 'store'),
                'a NULL from_stage advances nothing');

-- only running rows at from_stage held by the dispatcher
SELECT results_eq(
    format('SELECT * FROM pepsi.advance_many(ARRAY[%s, %s, %s, %s, %s, %s, -1]::bigint[],'
           ' %L, %L, 7) AS i ORDER BY i',
           :a2, :theirs, :a1, :elsewhere, :pend, :fin, 'fetch', 'store'),
    format('VALUES (%s::bigint), (%s)', :a1, :a2),
    'advance_many returns the ids it advanced, and only those');
SELECT results_eq(format('SELECT * FROM pg_temp.row_of(%s)', :a1),
    $$VALUES ('store'::text, 'pending'::text, 0, NULL::bigint, NULL::timestamptz, '{"k": "v"}'::jsonb)$$,
    'advance_many sets stage, status pending, retries 0, no dispatcher; keeps state');
SELECT is((SELECT stage || '/' || status FROM pepsi.workqueue WHERE workqueue_id = :a2),
          'store/pending', 'the second id moved too');
SELECT results_eq(format('SELECT * FROM pg_temp.row_of(%s)', :a3),
    $$VALUES ('fetch'::text, 'running'::text, 2, 7::bigint, NULL::timestamptz, '{"k": "v"}'::jsonb)$$,
    'an id not asked for is left alone');
SELECT results_eq(format('SELECT status, dispatcher_id FROM pg_temp.row_of(%s)', :theirs),
    $$VALUES ('running'::text, 8::bigint)$$, 'a row of another dispatcher is left alone');
SELECT results_eq(format('SELECT stage, status FROM pg_temp.row_of(%s)', :elsewhere),
    $$VALUES ('parse'::text, 'running'::text)$$, 'a row at another stage is left alone');
SELECT results_eq(format('SELECT stage, status FROM pg_temp.row_of(%s) UNION ALL'
                         ' SELECT stage, status FROM pg_temp.row_of(%s)', :pend, :fin),
    $$VALUES ('fetch'::text, 'pending'::text), ('fetch', 'done')$$,
    'pending and done rows are left alone');
SELECT is_empty(format('SELECT * FROM pepsi.advance_many(ARRAY[%s, %s]::bigint[], %L, %L, 7)',
                       :a1, :a2, 'fetch', 'store'),
                'advanced rows are not advanced twice');
SELECT results_eq(
    format('SELECT * FROM pepsi.advance_many(ARRAY[%s, %s]::bigint[], %L, %L) AS i ORDER BY i',
           :anyholder, :theirs, 'fetch', 'store'),
    format('SELECT unnest(ARRAY[%s, %s]::bigint[]) AS i ORDER BY i', :anyholder, :theirs),
    'without a dispatcher_id any holder goes');

-- Who may call it: a stage program; not the dispatcher, not producers, not PUBLIC.
SELECT pg_temp.running('fetch', 7) AS mine \gset
SET LOCAL ROLE pepsi_stage;
SELECT is((SELECT array_agg(i) FROM pepsi.advance_many(ARRAY[:mine]::bigint[], 'fetch', 'store', 7) AS i),
          ARRAY[:mine]::bigint[], 'a stage can advance_many');
RESET ROLE;
SELECT is(
    (SELECT array_agg(r ORDER BY r) FROM unnest(ARRAY['pepsi_dispatcher', 'pepsi_ingress', 'pepsi_dashboard', 'public']) AS r
      WHERE has_function_privilege(r, 'pepsi.advance_many(bigint[], text, text, bigint)', 'EXECUTE')),
    NULL, 'no other role may call it');

SELECT * FROM finish();
ROLLBACK;
