-- Payloads are JSON objects: enqueue and enqueue_many refuse anything else.
BEGIN;
SELECT plan(10);

SELECT throws_ok($$SELECT pepsi.enqueue('s', '42')$$, '22023',
                 'payload must be a JSON object, not a JSON number', 'a number is refused');
SELECT throws_ok($$SELECT pepsi.enqueue('s', '[1, 2]')$$, '22023',
                 'payload must be a JSON object, not a JSON array', 'an array is refused');
SELECT throws_ok($$SELECT pepsi.enqueue('s', '"text"')$$, '22023', NULL, 'a string is refused');
SELECT throws_ok($$SELECT pepsi.enqueue('s', 'null'::jsonb)$$, '22023',
                 'payload must be a JSON object, not a JSON null', 'a JSON null is refused');
SELECT throws_ok($$SELECT pepsi.enqueue('s', 'true')$$, '22023', NULL, 'a boolean is refused');
SELECT lives_ok($$SELECT pepsi.enqueue('s', '{"a": [1]}')$$, 'an object is accepted');
SELECT lives_ok($$SELECT pepsi.enqueue('s', NULL)$$, 'SQL NULL is still stored as {}');
SELECT throws_ok($$SELECT * FROM pepsi.enqueue_many('s', ARRAY['{}', '{}', '7']::jsonb[])$$, '22023',
                 'payload 3 of 3 must be a JSON object, not a JSON number',
                 'enqueue_many names the first bad payload');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue WHERE stage = 's'), 2,
          'refused calls inserted nothing (enqueue_many is all or nothing)');
SELECT lives_ok($$SELECT * FROM pepsi.enqueue_many('s', ARRAY['{}', NULL]::jsonb[])$$,
                'enqueue_many accepts objects and NULL elements');

SELECT * FROM finish();
ROLLBACK;
