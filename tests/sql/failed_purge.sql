-- pepsi.failed_messages and pepsi.purge: the operator's view of failures and
-- deletion of terminal rows (pepsi-queue failed / purge).
BEGIN;
SELECT plan(14);

CREATE FUNCTION pg_temp.row_in(s text, st text, st8 jsonb DEFAULT '{}', age interval DEFAULT '0')
RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO pepsi.workqueue (stage, status, state, dispatcher_id, timeout, updated_at)
    VALUES (s, st, st8, CASE WHEN st = 'running' THEN 1 END,
            CASE WHEN st = 'paused' THEN now() END, now() - age)
    RETURNING workqueue_id $$;

SELECT pg_temp.row_in('extract', 'failed', '{"error": "no total"}') AS f1,
       pg_temp.row_in('extract', 'timeout', '{"dispatch_error": "killed after 300 s"}') AS t1,
       pg_temp.row_in('store', 'failed', '{"error": "stage", "dispatch_error": "1 disk full"}') AS f2,
       pg_temp.row_in('store', 'expired') AS e1,
       pg_temp.row_in('store', 'done', '{}', '8 days') AS old_done,
       pg_temp.row_in('store', 'done') AS new_done,
       pg_temp.row_in('store', 'pending') AS p1,
       pg_temp.row_in('store', 'running') AS r1,
       pg_temp.row_in('store', 'paused') AS z1
\gset

SELECT results_eq('SELECT workqueue_id, error FROM pepsi.failed_messages()',
    format($$VALUES (%s::bigint, 'expired'::text), (%s, '1 disk full'), (%s, 'killed after 300 s'),
                    (%s, 'no total')$$, :e1, :f2, :t1, :f1),
    'failed_messages: terminal error rows, newest first, dispatch_error before error before status');
SELECT results_eq($$SELECT workqueue_id FROM pepsi.failed_messages('extract')$$,
    format('VALUES (%s::bigint), (%s)', :t1, :f1), 'failed_messages of one stage');
SELECT is((SELECT count(*) FROM pepsi.failed_messages(NULL, 2)), 2::bigint, 'max_rows limits');
SELECT is_empty($$SELECT * FROM pepsi.failed_messages('nothing')$$, 'unknown stage: no rows');

SELECT throws_ok($$SELECT pepsi.purge(ARRAY['pending'])$$, '22023', NULL,
                 'purge refuses pending');
SELECT throws_ok($$SELECT pepsi.purge(ARRAY['done', 'running'])$$, '22023', NULL,
                 'purge refuses running among others');
SELECT throws_ok($$SELECT pepsi.purge(ARRAY[]::text[])$$, '22023', NULL,
                 'purge refuses an empty list');
SELECT throws_ok($$SELECT pepsi.purge(NULL)$$, '22023', NULL, 'purge refuses NULL');
SELECT is(pepsi.purge(ARRAY['done'], NULL, '7 days'), 1::bigint, 'purge done older than 7 days');
SELECT is((SELECT count(*) FROM pepsi.workqueue WHERE workqueue_id = :old_done), 0::bigint,
          'the old done row is gone');
SELECT is(pepsi.purge(ARRAY['failed', 'timeout'], 'extract'), 2::bigint,
          'purge by status and stage');
SELECT is(pepsi.purge(ARRAY['done', 'failed', 'timeout', 'expired']), 3::bigint,
          'purge every terminal row left');
SELECT results_eq('SELECT status FROM pepsi.workqueue ORDER BY workqueue_id',
    $$VALUES ('pending'::text), ('running'), ('paused')$$,
    'pending, running and paused rows are never purged');
SELECT is(pepsi.purge(ARRAY['done']), 0::bigint, 'nothing left to purge');

SELECT * FROM finish();
ROLLBACK;
