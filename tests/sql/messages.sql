-- get_message, get_messages (workers read) and set_state (workers note).
BEGIN;
SELECT plan(16);

CREATE FUNCTION pg_temp.running(s text, d bigint) RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO pepsi.workqueue (stage, status, dispatcher_id, payload, state, retries)
    VALUES (s, 'running', d, '{"url": "u"}', '{"a": 1, "b": {"c": 2}}', 1)
    RETURNING workqueue_id $$;
SELECT pg_temp.running('read', 3) AS one, pg_temp.running('read', 3) AS two \gset
SELECT pepsi.enqueue('read', '{"p": true}') AS pend \gset

SELECT results_eq(format('SELECT * FROM pepsi.get_message(%s)', :one),
    format($$VALUES (%s::bigint, 'read'::text, 'running'::text, '{"url": "u"}'::jsonb,
                     '{"a": 1, "b": {"c": 2}}'::jsonb, 1)$$, :one),
    'get_message returns id, stage, status, payload, state, retries');
SELECT is_empty('SELECT * FROM pepsi.get_message(-5)', 'get_message of a missing id is empty');
SELECT is_empty('SELECT * FROM pepsi.get_message(NULL)', 'get_message of NULL is empty');
SELECT results_eq(format('SELECT workqueue_id FROM pepsi.get_messages(ARRAY[%s, -1, %s, %s]::bigint[])',
                         :pend, :two, :one),
    format('VALUES (%s::bigint), (%s), (%s)', :pend, :two, :one),
    'get_messages returns existing ids in the order asked');
SELECT is_empty('SELECT * FROM pepsi.get_messages(ARRAY[]::bigint[])', 'get_messages of [] is empty');
SELECT is_empty('SELECT * FROM pepsi.get_messages(NULL)', 'get_messages of NULL is empty');

SELECT is(pepsi.set_state(:one, 'read', '{"b": 3, "n": "x"}', 3), true,
          'set_state merges into a running row');
SELECT is((SELECT state FROM pepsi.workqueue WHERE workqueue_id = :one),
          '{"a": 1, "b": 3, "n": "x"}'::jsonb, 'top-level keys of the patch replace, others stay');
SELECT is(pepsi.set_state(:one, 'other', '{"z": 1}', 3), false, 'set_state refuses a wrong stage');
SELECT is(pepsi.set_state(:one, 'read', '{"z": 1}', 4), false, 'set_state refuses a wrong dispatcher');
SELECT is(pepsi.set_state(:pend, 'read', '{"z": 1}'), false, 'set_state refuses a pending row');
SELECT is(pepsi.set_state(NULL, 'read', '{"z": 1}'), false, 'set_state of a NULL id changes nothing');
SELECT throws_ok(format('SELECT pepsi.set_state(%s, %L, %L)', :one, 'read', '{"dispatch_error": "x"}'),
                 '22023', 'reserved state keys in patch: dispatch_error (only the queue writes them)',
                 'set_state may not write dispatch_error');
SELECT throws_ok(format('SELECT pepsi.set_state(%s, %L, %L)', :one, 'read', '[1, 2]'),
                 '22023', NULL, 'set_state refuses a patch that is not an object');
SELECT throws_ok(format('SELECT pepsi.set_state(%s, %L, NULL)', :one, 'read'),
                 '22023', NULL, 'set_state refuses a NULL patch');
SELECT is((SELECT state FROM pepsi.workqueue WHERE workqueue_id = :one),
          '{"a": 1, "b": 3, "n": "x"}'::jsonb, 'refused patches changed nothing');

SELECT * FROM finish();
ROLLBACK;
