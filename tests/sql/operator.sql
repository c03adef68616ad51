-- Operator functions behind pepsi-queue: failed_messages and purge.
BEGIN;
SELECT plan(12);

INSERT INTO pepsi.workqueue (stage, status, state, updated_at, dispatcher_id, timeout) VALUES
    ('a', 'failed',  '{"error": "bad input"}',                     now() - interval '2 days', NULL, NULL),
    ('a', 'timeout', '{"dispatch_error": "timeout after 300 s"}', now() - interval '2 days', NULL, NULL),
    ('b', 'expired', '{}',                                         now(),                     NULL, NULL),
    ('b', 'failed',  '{"error": "x", "dispatch_error": "crash"}',  now(),                     NULL, NULL),
    ('a', 'done',    '{}',                                         now() - interval '2 days', NULL, NULL),
    ('a', 'pending', '{}',                                         now() - interval '2 days', NULL, NULL),
    ('a', 'running', '{}',                                         now() - interval '2 days', 1,    NULL),
    ('a', 'paused',  '{}',                                         now() - interval '2 days', NULL, now());

SELECT results_eq('SELECT stage, status, error FROM pepsi.failed_messages()',
    $$VALUES ('b'::text, 'failed'::text, 'crash'::text), ('b', 'expired', 'expired'),
             ('a', 'timeout', 'timeout after 300 s'), ('a', 'failed', 'bad input')$$,
    'failed_messages lists failed, timeout and expired rows, newest first, with the error to show');
SELECT is((SELECT count(*)::int FROM pepsi.failed_messages('a')), 2, 'failed_messages of one stage');
SELECT is((SELECT count(*)::int FROM pepsi.failed_messages(NULL, 1)), 1, 'failed_messages limit');
SELECT is((SELECT count(*)::int FROM pepsi.failed_messages(NULL, -1)), 0, 'a negative limit shows nothing');

SELECT throws_ok($$SELECT pepsi.purge(ARRAY['pending'])$$, '22023', NULL, 'purge refuses pending rows');
SELECT throws_ok($$SELECT pepsi.purge(ARRAY['running', 'done'])$$, '22023', NULL, 'purge refuses running rows');
SELECT throws_ok($$SELECT pepsi.purge(NULL)$$, '22023', NULL, 'purge needs statuses');
SELECT is(pepsi.purge(ARRAY['failed'], 'a', interval '1 day'), 1::bigint,
          'purge by status, stage and age');
SELECT is(pepsi.purge(ARRAY['failed', 'expired'], NULL, interval '1 day'), 0::bigint,
          'younger rows stay');
SELECT is(pepsi.purge(ARRAY['failed', 'expired', 'timeout', 'done']), 4::bigint,
          'no stage, no age: every row in those statuses');
SELECT is((SELECT array_agg(status ORDER BY status) FROM pepsi.workqueue),
          ARRAY['paused', 'pending', 'running'], 'live rows are never purged');
SET LOCAL ROLE pepsi_stage;
SELECT throws_ok($$SELECT pepsi.purge(ARRAY['done'])$$, '42501', NULL, 'a stage cannot purge');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
