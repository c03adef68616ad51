-- pepsi.requeue_matching / pepsi.cancel_matching: bulk actions on a list
-- filter select exactly what pepsi.list_messages lists for that filter (of
-- the statuses the action acts on), count without acting (dry_run), keep
-- dedupe keys as requeue_failed does, stop at before_id, have no row cap,
-- and are granted to pepsi_operator and pepsi_dashboard only.
BEGIN;
SELECT plan(22);

INSERT INTO pepsi.workqueue (stage, status, payload, state, updated_at) VALUES
    ('a', 'failed',  '{"customer": 7}', '{"error": "bad input n=3"}', now() - interval '2 h'),
    ('a', 'failed',  '{"customer": 7}', '{"error": "bad input n=4"}', now() - interval '1 min'),
    ('a', 'timeout', '{"customer": 8}', '{"error": "timed out"}',     now() - interval '2 h'),
    ('b', 'failed',  '{"customer": 7}', '{"error": "bad input n=5"}', now() - interval '2 h'),
    ('a', 'done',    '{"customer": 7}', '{}',                         now() - interval '2 h'),
    ('a', 'pending', '{"customer": 7}', '{}',                         now() - interval '2 h');
SELECT min(workqueue_id) AS first FROM pepsi.workqueue \gset

-- One source: the count is what list_messages lists for the same filter.
SELECT results_eq(
    $$SELECT matched, acted FROM pepsi.requeue_matching(in_stage => 'a',
        payload_contains => '{"customer": 7}', dry_run => true)$$,
    $$SELECT count(*)::int, 0 FROM pepsi.list_messages(ARRAY['failed', 'timeout', 'expired'], 'a',
        payload_contains => '{"customer": 7}', max_rows => 10000)$$,
    'requeue dry run: the count of what list_messages lists for the filter, failed statuses only');
SELECT is((SELECT newest_id FROM pepsi.requeue_matching(in_stage => 'a', dry_run => true)),
          :first + 2::bigint, 'newest_id: the highest id selected');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue WHERE status = 'pending'), 1,
          'a dry run moves nothing');
SELECT is((SELECT matched FROM pepsi.requeue_matching(older_than => interval '1 h',
                                                      dry_run => true)), 3,
          'older_than: last updated before, as the list');
SELECT is((SELECT matched FROM pepsi.requeue_matching(reason_group => 'bad input n=<n>',
                                                      in_stage => 'a', dry_run => true)), 2,
          'reason_group: one normalised reason, as the list');
SELECT is((SELECT matched FROM pepsi.requeue_matching(statuses => ARRAY['timeout', 'done'],
                                                      dry_run => true)), 1,
          'statuses: only those the action acts on');
SELECT throws_ok($$SELECT * FROM pepsi.requeue_matching(statuses => ARRAY['pending'])$$, '22023',
                 NULL, 'requeue of a status it never acts on is refused');
SELECT throws_ok($$SELECT * FROM pepsi.requeue_matching(statuses => ARRAY['pendin'])$$, '22023',
                 NULL, 'an unknown status is refused, as by the list');

-- Acting: before_id bounds the selection to what was counted.
SELECT results_eq(
    format($$SELECT matched, acted FROM pepsi.requeue_matching(in_stage => 'a',
        payload_contains => '{"customer": 7}', before_id => %s)$$, :first + 1),
    $$VALUES (1, 1)$$, 'before_id: only the rows below it');
SELECT results_eq(
    $$SELECT matched, acted FROM pepsi.requeue_matching(in_stage => 'a',
        payload_contains => '{"customer": 7}')$$,
    $$VALUES (1, 1)$$, 'requeue: the other matching row');
SELECT results_eq(format($$SELECT status, retries, state -> 'previous_error' ->> 'error'
                             FROM pepsi.workqueue WHERE workqueue_id = %s$$, :first),
    $$VALUES ('pending'::text, 0, 'bad input n=3'::text)$$,
    'a requeued row is pending, retries 0, its error kept (requeue_failed''s rules)');
SELECT results_eq($$SELECT stage, status FROM pepsi.workqueue WHERE status IN ('failed', 'timeout')
                    ORDER BY workqueue_id$$,
    $$VALUES ('a'::text, 'timeout'::text), ('b', 'failed')$$,
    'rows outside the filter stay where they are');

-- Dedupe keys: a key a live message carries keeps its failed row.
INSERT INTO pepsi.workqueue (stage, status, state, dedupe_key) VALUES
    ('k', 'failed', '{"error": "x"}', 'key1'),
    ('k', 'failed', '{"error": "x"}', 'key2'),
    ('k', 'pending', '{}', 'key2');
SELECT results_eq($$SELECT matched, acted FROM pepsi.requeue_matching(in_stage => 'k')$$,
    $$VALUES (2, 1)$$, 'dedupe keys: the row whose key a pending message holds stays failed');

-- Cancel: pending and paused rows of the filter; running ones never.
INSERT INTO pepsi.workqueue (stage, status, payload, dispatcher_id, timeout) VALUES
    ('c', 'pending', '{"n": 1}', NULL, NULL),
    ('c', 'paused',  '{"n": 1}', NULL, now() + interval '1 h'),
    ('c', 'running', '{"n": 1}', 1, now() + interval '1 h'),
    ('c', 'pending', '{"n": 2}', NULL, NULL);
SELECT results_eq($$SELECT matched, acted FROM pepsi.cancel_matching(in_stage => 'c',
                      payload_contains => '{"n": 1}', dry_run => true)$$,
    $$VALUES (2, 0)$$, 'cancel dry run: pending and paused rows of the filter');
SELECT results_eq($$SELECT matched, acted FROM pepsi.cancel_matching(in_stage => 'c',
                      payload_contains => '{"n": 1}')$$,
    $$VALUES (2, 2)$$, 'cancel: both');
SELECT results_eq($$SELECT status, state ->> 'error' FROM pepsi.workqueue WHERE stage = 'c'
                    ORDER BY workqueue_id$$,
    $$VALUES ('failed'::text, 'cancelled by operator'::text), ('failed', 'cancelled by operator'),
             ('running', NULL), ('pending', NULL)$$,
    'cancelled as pepsi.cancel does; the running row and the other payload untouched');
SELECT throws_ok($$SELECT * FROM pepsi.cancel_matching(statuses => ARRAY['failed'])$$, '22023',
                 NULL, 'cancel of failed rows is refused');
SELECT results_eq($$SELECT matched, acted, newest_id FROM pepsi.cancel_matching(in_stage => 'none')$$,
    $$VALUES (0, 0, NULL::bigint)$$, 'nothing matches: 0, and no newest id');

-- No row cap: every page at once.
INSERT INTO pepsi.workqueue (stage, status) SELECT 'many', 'pending' FROM generate_series(1, 10001);
SELECT results_eq($$SELECT matched, acted FROM pepsi.cancel_matching(in_stage => 'many')$$,
    $$VALUES (10001, 10001)$$, 'more rows than one list page holds');

-- Who may call them.
SELECT ok(has_function_privilege('pepsi_operator',
          'pepsi.requeue_matching(text[], text, interval, jsonb, text, bigint, boolean)', 'EXECUTE')
       AND has_function_privilege('pepsi_dashboard',
          'pepsi.requeue_matching(text[], text, interval, jsonb, text, bigint, boolean)', 'EXECUTE'),
          'requeue_matching: pepsi_operator and pepsi_dashboard');
SELECT ok(has_function_privilege('pepsi_operator',
          'pepsi.cancel_matching(text[], text, interval, jsonb, bigint, boolean)', 'EXECUTE')
       AND has_function_privilege('pepsi_dashboard',
          'pepsi.cancel_matching(text[], text, interval, jsonb, bigint, boolean)', 'EXECUTE'),
          'cancel_matching: pepsi_operator and pepsi_dashboard');
SELECT ok(NOT has_function_privilege('pepsi_stage',
          'pepsi.requeue_matching(text[], text, interval, jsonb, text, bigint, boolean)', 'EXECUTE')
       AND NOT has_function_privilege('pepsi_ingress',
          'pepsi.cancel_matching(text[], text, interval, jsonb, bigint, boolean)', 'EXECUTE'),
          'stages and producers may not');

SELECT * FROM finish();
ROLLBACK;
