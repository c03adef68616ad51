-- A producer's own COPY: the columns it may insert, what the table refuses,
-- and copy_mark / copied_ids, which give it the ids its rows drew.
BEGIN;
SELECT plan(27);

SET LOCAL ROLE pepsi_ingress;
SELECT pepsi.copy_mark() AS m1 \gset
INSERT INTO pepsi.workqueue (stage, priority, payload)
VALUES ('c', 0, '{"n": 1}'), ('c', 5, '{"n": 2}'), ('c', -1, '{"n": 3}');
SELECT pepsi.copy_mark() AS m2 \gset
SELECT is((:m2 - :m1)::bigint, 3::bigint, 'copy_mark moved by the rows inserted: nobody else drew ids');
SELECT is(pepsi.copied_ids(:m1, 3), ARRAY[:m1 + 1, :m1 + 2, :m1 + 3]::bigint[],
          'copied_ids: the ids of this transaction''s statement that inserted 3 rows, ascending');
SELECT is(pepsi.copied_ids(:m2, 3), NULL::bigint[], 'no such statement above the second mark');
SELECT is(pepsi.copied_ids(:m1, 2), NULL::bigint[], 'nor one of another size');
SELECT throws_ok($$INSERT INTO pepsi.workqueue (stage, payload) VALUES ('c', '[1]')$$, '23514', NULL,
                 'a payload that is not a JSON object is refused by the table');
SELECT throws_ok($$INSERT INTO pepsi.workqueue (stage, payload) VALUES ('c c', '{}')$$, '23514', NULL,
                 'a malformed stage name is refused by the table');
SELECT throws_ok($$INSERT INTO pepsi.workqueue (stage, payload) VALUES ('c', NULL)$$, '23502', NULL,
                 'a NULL payload is refused');
SELECT throws_ok($$INSERT INTO pepsi.workqueue (stage, payload, status) VALUES ('c', '{}', 'running')$$,
                 '42501', NULL, 'a producer may not set any other column (status)');
RESET ROLE;

SELECT results_eq(
    format('SELECT status, priority, payload, state, dedupe_key, dispatcher_id, retries, timeout
              FROM pepsi.workqueue WHERE workqueue_id > %s ORDER BY workqueue_id', :m1),
    $$VALUES ('pending'::text, 0, '{"n": 1}'::jsonb, '{}'::jsonb, NULL::text, NULL::bigint, 0, NULL::timestamptz),
             ('pending', 5, '{"n": 2}', '{}', NULL, NULL, 0, NULL),
             ('pending', -1, '{"n": 3}', '{}', NULL, NULL, 0, NULL)$$,
    'every other column takes its default: a pending message, no key, not held');

-- Another statement of the same transaction (another thread on the same
-- connection) is told apart by its command; one of the same size makes the
-- answer ambiguous: NULL.
INSERT INTO pepsi.workqueue (stage) VALUES ('c'), ('c');
SELECT is(pepsi.copied_ids(:m1, 3), ARRAY[:m1 + 1, :m1 + 2, :m1 + 3]::bigint[],
          'another statement''s rows in the same transaction are not the COPY''s');
-- Rows of another (sub)transaction carry another xmin.
SAVEPOINT other;
INSERT INTO pepsi.workqueue (stage) VALUES ('c'), ('c'), ('c');
RELEASE SAVEPOINT other;
SELECT is(pepsi.copied_ids(:m1, 3), ARRAY[:m1 + 1, :m1 + 2, :m1 + 3]::bigint[],
          'rows of a subtransaction are not counted: the COPY must run at the top level');
INSERT INTO pepsi.workqueue (stage) VALUES ('c'), ('c'), ('c');
SELECT is(pepsi.copied_ids(:m1, 3), NULL::bigint[],
          'two statements of the transaction inserted 3 rows each: ambiguous, NULL');
-- A statement that changed 3 rows of the transaction (the COPY's among them)
-- gives them its command: they are not taken for a COPY's.
DELETE FROM pepsi.workqueue WHERE workqueue_id > :m1 + 3;
INSERT INTO pepsi.workqueue (stage) VALUES ('c') RETURNING workqueue_id AS other \gset
UPDATE pepsi.workqueue SET state = '{"x": 1}' WHERE workqueue_id IN (:m1 + 1, :m1 + 2, :other);
SELECT is(pepsi.copied_ids(:m1, 3), NULL::bigint[],
          'rows another statement changed are not a COPY''s, even 3 of them');

-- The look-up is a range of the primary key, never a scan of the table.
CREATE FUNCTION pg_temp.plan_of(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE p json;
BEGIN
    SET LOCAL enable_seqscan = off;
    EXECUTE 'EXPLAIN (FORMAT JSON) ' || q INTO p;
    RETURN p::text;
END $$;
SELECT matches(pg_temp.plan_of(format($$SELECT w.workqueue_id FROM pepsi.workqueue AS w
    WHERE w.workqueue_id > %s AND w.xmin = pg_current_xact_id()::xid$$, :m1)),
    '"Index Name": "workqueue_pkey"', 'copied_ids'' statement reads the primary key');
SELECT ok('enable_seqscan=off' = ANY (p.proconfig), 'copied_ids runs with enable_seqscan off')
  FROM pg_proc p WHERE p.oid = 'pepsi.copied_ids(bigint, bigint)'::regprocedure;

-- A sequence that caches ids ahead: the mark cannot be read off it.
ALTER SEQUENCE pepsi.workqueue_workqueue_id_seq CACHE 10;
SELECT is(pepsi.copy_mark(), NULL::bigint, 'copy_mark is NULL when the id sequence caches ahead');
ALTER SEQUENCE pepsi.workqueue_workqueue_id_seq CACHE 1;
SELECT isnt(pepsi.copy_mark(), NULL::bigint, 'and a number again with CACHE 1');

SET LOCAL ROLE pepsi_dashboard;
SELECT throws_ok('SELECT pepsi.copy_mark()', '42501', NULL, 'the dashboard cannot call copy_mark');
SELECT throws_ok($$SELECT * FROM pepsi.key_holders('{a}')$$, '42501', NULL,
                 'nor key_holders');
RESET ROLE;

-- Keyed producers (a keyed COPY): the key is the producer's to set, the table
-- refuses a key a live message holds and one pepsi.enqueue would refuse, and
-- key_holders tells which keys live messages hold.
SELECT pepsi.enqueue('c', '{}', dedupe_key => 'held-by-live') AS live \gset
SELECT pepsi.enqueue('c', '{}', dedupe_key => 'held-by-done') AS gone \gset
UPDATE pepsi.workqueue SET status = 'done' WHERE workqueue_id = :gone;
SET LOCAL ROLE pepsi_ingress;
SELECT results_eq(
    $$SELECT dedupe_key, workqueue_id FROM pepsi.key_holders('{held-by-live,held-by-live,held-by-done,free,NULL}')$$,
    format('VALUES (%L::text, %s::bigint)', 'held-by-live', :live),
    'key_holders: a key a live message holds, once, with its id; a done one''s key and a free key are not held');
SELECT is((SELECT count(*) FROM pepsi.key_holders('{}')), 0::bigint, 'no keys, no rows');
INSERT INTO pepsi.workqueue (stage, priority, payload, dedupe_key)
VALUES ('c', 2, '{"k": 1}', 'fresh'), ('c', 2, '{"k": 2}', NULL), ('c', 2, '{"k": 3}', 'held-by-done');
SELECT results_eq(
    $$SELECT dedupe_key FROM pepsi.key_holders('{fresh,held-by-done}') ORDER BY 1$$,
    $$VALUES ('fresh'::text), ('held-by-done')$$,
    'a producer inserts keys itself: a fresh one, and one whose message is done');
SELECT throws_ok($$INSERT INTO pepsi.workqueue (stage, payload, dedupe_key) VALUES ('c', '{}', 'held-by-live')$$,
                 '23505', NULL, 'a key a live message holds is refused by the unique index');
SELECT throws_ok($$INSERT INTO pepsi.workqueue (stage, payload, dedupe_key) VALUES ('c', '{}', E' \t ')$$,
                 '23514', NULL, 'a key of only whitespace is refused by the table');
SELECT throws_ok(format($$INSERT INTO pepsi.workqueue (stage, payload, dedupe_key) VALUES ('c', '{}', %L)$$,
                        repeat('k', 513)),
                 '23514', NULL, 'a key longer than 512 bytes is refused by the table');
SELECT lives_ok(format($$INSERT INTO pepsi.workqueue (stage, payload, dedupe_key) VALUES ('c', '{}', %L)$$,
                       repeat('é', 256)),
                'a key of exactly 512 bytes is taken');
RESET ROLE;
SELECT matches(pg_temp.plan_of($$SELECT h.workqueue_id FROM pepsi.workqueue AS h
    WHERE h.dedupe_key = ANY ('{a,b}'::text[]) AND h.dedupe_key IS NOT NULL
      AND h.status IN ('pending', 'running', 'paused')$$),
    '"Index Name": "workqueue_dedupe_idx"', 'key_holders'' statement reads workqueue_dedupe_idx');

SELECT * FROM finish();
ROLLBACK;
