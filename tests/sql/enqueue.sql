-- pepsi.enqueue / pepsi.enqueue_many: ingress.
BEGIN;
SELECT plan(16);

SELECT ok(pepsi.enqueue('ingest', '{"n": 1}') > 0, 'enqueue returns the new id');
SELECT results_eq(
    $$SELECT stage, status, payload, state, retries, dispatcher_id, timeout
        FROM pepsi.workqueue WHERE stage = 'ingest'$$,
    $$VALUES ('ingest'::text, 'pending'::text, '{"n": 1}'::jsonb, '{}'::jsonb, 0,
              NULL::bigint, NULL::timestamptz)$$,
    'enqueue inserts one pending row with the payload and an empty state');
SELECT ok(pepsi.enqueue('ingest') < pepsi.enqueue('ingest'), 'ids increase');
SELECT pepsi.enqueue('nullpayload', NULL), pepsi.enqueue('defaultpayload');
SELECT is((SELECT payload FROM pepsi.workqueue WHERE stage = 'nullpayload'), '{}'::jsonb,
          'a NULL payload is stored as {}');
SELECT is((SELECT payload FROM pepsi.workqueue WHERE stage = 'defaultpayload'), '{}'::jsonb,
          'the payload defaults to {}');
SELECT throws_ok($$SELECT pepsi.enqueue('bad stage', '{}')$$, '22023',
                 'invalid stage name ''bad stage''', 'enqueue refuses a stage name with a space');
SELECT throws_ok($$SELECT pepsi.enqueue('', '{}')$$, '22023', NULL,
                 'enqueue refuses an empty stage name');
SELECT throws_ok($$SELECT pepsi.enqueue('a/b')$$, '22023', NULL,
                 'enqueue refuses a stage name with a slash');
SELECT throws_ok($$SELECT pepsi.enqueue(NULL, '{}')$$, '22023', 'invalid stage name NULL',
                 'enqueue refuses a NULL stage');

CREATE TEMP TABLE many AS
SELECT id, row_number() OVER () AS n
  FROM pepsi.enqueue_many('bulk', ARRAY['{"i": 1}', '{"i": 2}', NULL, '{"i": 4}']::jsonb[]) AS id;
SELECT is((SELECT count(*)::int FROM many), 4, 'enqueue_many returns one id per payload');
SELECT ok((SELECT bool_and(m.id > p.id) FROM many m JOIN many p ON p.n = m.n - 1),
          'enqueue_many returns increasing ids in array order');
SELECT results_eq(
    $$SELECT w.payload FROM many m JOIN pepsi.workqueue w ON w.workqueue_id = m.id ORDER BY m.n$$,
    $$VALUES ('{"i": 1}'::jsonb), ('{"i": 2}'), ('{}'), ('{"i": 4}')$$,
    'payloads are stored in array order, NULL as {}');
SELECT is_empty($$SELECT * FROM pepsi.enqueue_many('bulk', ARRAY[]::jsonb[])$$,
                'enqueue_many of an empty array inserts nothing');
SELECT is_empty($$SELECT * FROM pepsi.enqueue_many('bulk', NULL)$$,
                'enqueue_many of NULL inserts nothing');
SELECT throws_ok($$SELECT * FROM pepsi.enqueue_many('no good', ARRAY['{}']::jsonb[])$$,
                 '22023', NULL, 'enqueue_many refuses a bad stage name');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue WHERE stage = 'bulk'), 4,
          'refused and empty calls inserted nothing');

SELECT * FROM finish();
ROLLBACK;
