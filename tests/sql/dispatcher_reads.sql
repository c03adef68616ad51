-- The dispatcher's reads of migration 0014 (it selects from no table):
-- dispatcher_registered, held_ids, stages_of, and who may call them.
BEGIN;
SELECT plan(17);

CREATE FUNCTION pg_temp.running(s text, d bigint) RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO pepsi.workqueue (stage, status, dispatcher_id)
    VALUES (s, 'running', d) RETURNING workqueue_id $$;

SELECT pepsi.register_dispatcher('host-a', 100, true) AS me,
       pepsi.register_dispatcher('host-b', 200, true) AS other \gset

-- dispatcher_registered
SELECT is(pepsi.dispatcher_registered(:me), true, 'dispatcher_registered: a registered id');
SELECT is(pepsi.dispatcher_registered(-1), false, 'dispatcher_registered: an unknown id');
SELECT is(pepsi.dispatcher_registered(NULL), false, 'dispatcher_registered: NULL is false');
UPDATE pepsi.dispatchers SET heartbeat_at = now() - interval '1 h' WHERE dispatcher_id = :other;
SELECT pepsi.reset_orphans(:me, true, interval '5 min');
SELECT is(pepsi.dispatcher_registered(:other), false,
          'dispatcher_registered: false once a replica declared it dead');
SELECT pepsi.heartbeat(:other);
SELECT is(pepsi.dispatcher_registered(:other), true, 'and true again after its heartbeat');

-- held_ids
SELECT pg_temp.running('a', :me) AS m1 \gset
SELECT pg_temp.running('b', :me) AS m2 \gset
SELECT pg_temp.running('a', :other) AS o1 \gset
INSERT INTO pepsi.workqueue (stage, status) VALUES ('a', 'pending'), ('a', 'done');
SELECT results_eq(format('SELECT * FROM pepsi.held_ids(%s)', :me),
    format('VALUES (%s::bigint), (%s)', :m1, :m2),
    'held_ids: the running rows of that dispatcher, sorted, and no others');
SELECT pepsi.release(:me, ARRAY[:m1]::bigint[]);
SELECT results_eq(format('SELECT * FROM pepsi.held_ids(%s)', :me),
    format('VALUES (%s::bigint)', :m2), 'held_ids: a released row is no longer held');
SELECT is_empty('SELECT * FROM pepsi.held_ids(-1)', 'held_ids of an unknown dispatcher: none');
SELECT is_empty('SELECT * FROM pepsi.held_ids(NULL)', 'held_ids of NULL: none');

-- stages_of
SELECT pepsi.hop(:m2, 'b', 'c', :me);
SELECT results_eq(format('SELECT * FROM pepsi.stages_of(ARRAY[%s, %s, %s, %s, -1]::bigint[])',
                         :o1, :m2, :m1, :m2),
    format($$VALUES (%s::bigint, 'a'::text), (%s, 'c'), (%s, 'a')$$, :m1, :m2, :o1),
    'stages_of: the stage now (any status), sorted, once per id, unknown ids left out');
SELECT is_empty('SELECT * FROM pepsi.stages_of(NULL)', 'stages_of of NULL: none');
SELECT is_empty('SELECT * FROM pepsi.stages_of(ARRAY[]::bigint[])', 'stages_of of no ids: none');

-- Who may call them: the dispatcher; not stage programs, not producers, not PUBLIC.
SET LOCAL ROLE pepsi_dispatcher;
SELECT lives_ok(format('SELECT pepsi.dispatcher_registered(%s), (SELECT count(*) FROM pepsi.held_ids(%s)),'
                       ' (SELECT count(*) FROM pepsi.stages_of(ARRAY[%s]::bigint[]))', :me, :me, :m1),
                'the dispatcher can call all three');
RESET ROLE;
SELECT is(
    (SELECT array_agg(r ORDER BY r) FROM unnest(ARRAY['pepsi_stage', 'pepsi_ingress', 'pepsi_dashboard', 'public']) AS r
      WHERE has_function_privilege(r, 'pepsi.dispatcher_registered(bigint)', 'EXECUTE')
         OR has_function_privilege(r, 'pepsi.held_ids(bigint)', 'EXECUTE')
         OR has_function_privilege(r, 'pepsi.stages_of(bigint[])', 'EXECUTE')),
    NULL, 'no other role may call them');
SET LOCAL ROLE pepsi_stage;
SELECT throws_ok(format('SELECT * FROM pepsi.held_ids(%s)', :me), '42501', NULL,
                 'a stage program cannot list what a dispatcher holds');
RESET ROLE;
SET LOCAL ROLE pepsi_ingress;
SELECT throws_ok('SELECT * FROM pepsi.stages_of(ARRAY[1]::bigint[])', '42501', NULL,
                 'a producer cannot read stages');
SELECT throws_ok('SELECT pepsi.dispatcher_registered(1)', '42501', NULL,
                 'a producer cannot read the registry');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
