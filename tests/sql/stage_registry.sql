-- pepsi.register_stages / registered_stages: the dispatcher's stage table in the database.
BEGIN;
SELECT plan(10);

SELECT is(pepsi.register_stages(7, ARRAY['a', 'b', 'c'], ARRAY['b c', 'c', ''],
                                ARRAY[3, NULL, 0], ARRAY[interval '1 s', NULL, NULL],
                                ARRAY[interval '1 min', NULL, NULL], ARRAY[2, 4, 1],
                                ARRAY[4, 4, 1]), 3, 'register_stages returns the count');
SELECT results_eq('SELECT stage, next, max_retries, retry_delay, retry_delay_max, parallelism, queue_limit, dispatcher_id FROM pepsi.registered_stages()',
    $$VALUES ('a'::text, ARRAY['b', 'c'], 3, interval '1 s', interval '1 min', 2, 4, 7::bigint),
             ('b', ARRAY['c'], 10, NULL, NULL, 4, 4, 7),
             ('c', '{}', 0, NULL, NULL, 1, 1, 7)$$,
    'the registry holds the stages, NEXT as arrays, NULL max_retries as 10');

SELECT is(pepsi.register_stages(8, ARRAY['a', 'd'], ARRAY['d', NULL], ARRAY[5, 5],
                                ARRAY[NULL, NULL]::interval[], NULL, NULL, NULL), 2,
          'a second registration (after a reload)');
SELECT results_eq('SELECT stage, next, max_retries, retry_delay, dispatcher_id FROM pepsi.registered_stages()',
    $$VALUES ('a'::text, ARRAY['d'], 5, NULL::interval, 8::bigint), ('d', '{}', 5, NULL, 8)$$,
    'replaces the set: removed stages are gone, kept ones updated');

SELECT throws_ok($$SELECT pepsi.register_stages(1, ARRAY['a', 'b'], ARRAY['b'], NULL, NULL, NULL, NULL, NULL)$$,
                 '22023', NULL, 'arrays of different lengths are refused');
SELECT throws_ok($$SELECT pepsi.register_stages(1, ARRAY['a b'], NULL, NULL, NULL, NULL, NULL, NULL)$$,
                 '22023', NULL, 'a bad stage name is refused');
SELECT throws_ok($$SELECT pepsi.register_stages(1, ARRAY['a', 'a'], NULL, NULL, NULL, NULL, NULL, NULL)$$,
                 '22023', 'register_stages: stage a given twice', 'a stage given twice is refused');
SELECT is(pepsi.register_stages(1, ARRAY[]::text[], NULL, NULL, NULL, NULL, NULL, NULL), 0,
          'an empty stage table empties the registry');
SELECT is_empty('SELECT * FROM pepsi.registered_stages()', 'the registry is empty');

SET LOCAL ROLE pepsi_ingress;
SELECT lives_ok('SELECT * FROM pepsi.registered_stages()', 'producers may read the registry');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
