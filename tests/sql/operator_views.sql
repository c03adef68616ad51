-- The operator's views and actions of migration 0009: message_story,
-- failed_reasons, purge dry_run, queue_overview, queue_dispatchers, and who may call them.
BEGIN;
SELECT plan(17);

SELECT pepsi.register_stages(1, ARRAY['s'], NULL, ARRAY[4], NULL, NULL, ARRAY[2], ARRAY[3]);
INSERT INTO pepsi.workqueue (stage, status, payload, state, retries, created_at, updated_at)
VALUES ('s', 'failed', '{"k": 1}', '{"error": "bad input", "retry_error": "1 x"}', 2,
        now() - interval '1 h', now() - interval '10 min')
RETURNING workqueue_id AS f1 \gset
INSERT INTO pepsi.workqueue (stage, status, state) VALUES
    ('s', 'failed', '{"error": "bad input"}'),
    ('s', 'failed', '{"dispatch_error": "worker exited with code 1", "error": "ignored"}'),
    ('t', 'timeout', '{"dispatch_error": "timeout: 5 s"}'),
    ('t', 'expired', '{}');
SELECT pepsi.enqueue('t', '{}', now() + interval '5 min') AS delayed \gset
INSERT INTO pepsi.workqueue (stage, status, updated_at) VALUES
    ('s', 'pending', now() - interval '90 s'), ('s', 'pending', now() - interval '30 s'),
    ('s', 'done', now() - interval '10 s'), ('s', 'done', now() - interval '2 min');

-- message_story
SELECT results_eq(format('SELECT stage, status, payload, retries, max_retries, delayed, error, errors, age, since_update, due_in, stage_registered FROM pepsi.message_story(%s)', :f1),
    $$VALUES ('s'::text, 'failed'::text, '{"k": 1}'::jsonb, 2, 4, false, 'bad input'::text,
              '{"error": "bad input"}'::jsonb, interval '1 h',
              interval '10 min', NULL::interval, true)$$,
    'message_story: row, error, errors (a failed row''s old retry_error is not shown), retries with the stage''s cap, ages');
SELECT results_eq(format('SELECT status, delayed, due_in, stage_registered FROM pepsi.message_story(%s)', :delayed),
    $$VALUES ('paused'::text, true, interval '5 min', false)$$,
    'message_story of a delayed row: due_in, delayed, stage not registered');
SELECT is_empty('SELECT * FROM pepsi.message_story(-1)', 'message_story of an unknown id is empty');

-- failed_reasons
SELECT results_eq('SELECT stage, status, reason, count FROM pepsi.failed_reasons()',
    $$VALUES ('s'::text, 'failed'::text, 'bad input'::text, 2::bigint),
             ('s', 'failed', 'worker exited with code <n>', 1),
             ('t', 'expired', 'expired', 1),
             ('t', 'timeout', 'timeout: <n> s', 1)$$,
    'failed_reasons groups by stage, status and normalised reason, biggest first');
SELECT is((SELECT ids[array_length(ids, 1)] FROM pepsi.failed_reasons('s') WHERE reason = 'bad input'),
          :f1::bigint, 'each group lists its newest ids (oldest last)');
SELECT is((SELECT count(*)::int FROM pepsi.failed_reasons('t')), 2, 'failed_reasons of one stage');

-- purge dry_run
SELECT is(pepsi.purge(ARRAY['failed'], 's', NULL, true), 3::bigint, 'purge dry_run counts');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue WHERE status = 'failed'), 3,
          'and deletes nothing');
SELECT is(pepsi.purge(ARRAY['expired']), 1::bigint, 'purge with 1 argument still works');

-- queue_overview
SELECT results_eq($$SELECT stage, pending, paused, failed, done, done_last_minute, oldest_pending,
                           registered, parallelism, queue_limit FROM pepsi.queue_overview()$$,
    $$VALUES ('s'::text, 2::bigint, 0::bigint, 3::bigint, 2::bigint, 1::bigint, interval '90 s', true, 2, 3),
             ('t', 0, 1, 0, 0, 0, NULL, false, NULL, NULL)$$,
    'queue_overview: counts, oldest pending wait, done in the last minute, registration');
SELECT is((SELECT next_due FROM pepsi.queue_overview() WHERE stage = 't'), interval '5 min',
          'queue_overview: time until the next paused row is due');
INSERT INTO pepsi.stage_stats (stage, processed, failed) VALUES ('u', 5, 1);
SELECT results_eq($$SELECT processed_total, failed_total, pending FROM pepsi.queue_overview() WHERE stage = 'u'$$,
    $$VALUES (5::bigint, 1::bigint, 0::bigint)$$, 'a stage with statistics only is listed with its totals');

-- queue_dispatchers
SELECT pepsi.register_dispatcher('h', 42, false) AS did \gset
SELECT results_eq(format('SELECT hostname, pid, running FROM pepsi.queue_dispatchers() WHERE dispatcher_id = %s', :did),
    $$VALUES ('h'::text, 42, 0::bigint)$$, 'queue_dispatchers lists registrations');

-- Grants: operators (pepsi_dispatcher) may; stage programs and producers may not.
SET LOCAL ROLE pepsi_dispatcher;
SELECT lives_ok(format($$SELECT * FROM pepsi.message_story(%s);
                         SELECT * FROM pepsi.failed_reasons();
                         SELECT * FROM pepsi.queue_overview();
                         SELECT * FROM pepsi.queue_dispatchers();
                         SELECT pepsi.cancel(ARRAY[-1]::bigint[]);
                         SELECT pepsi.purge(ARRAY['done'], 'none', NULL, true)$$, :f1),
                'the operator role may call the views and cancel');
RESET ROLE;
SET LOCAL ROLE pepsi_stage;
SELECT throws_ok('SELECT pepsi.cancel(all_rows => true)', '42501', NULL, 'a stage program cannot cancel');
SELECT throws_ok($$SELECT pepsi.register_stages(1, ARRAY['x'], NULL, NULL, NULL, NULL, NULL, NULL)$$,
                 '42501', NULL, 'a stage program cannot register stages');
RESET ROLE;
SET LOCAL ROLE pepsi_ingress;
SELECT throws_ok(format('SELECT * FROM pepsi.message_story(%s)', :f1), '42501', NULL,
                 'a producer cannot read messages');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
