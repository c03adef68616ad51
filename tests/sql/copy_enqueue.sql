-- A producer's own COPY: the columns it may insert, what the table refuses,
-- and copy_mark / copied_ids, which give it the ids its rows drew.
BEGIN;
SELECT plan(17);

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
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
