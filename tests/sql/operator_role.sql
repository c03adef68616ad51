-- pepsi_operator (migration 0018): what a person's role may do, both ways,
-- and schema_version for every role.
BEGIN;
SELECT plan(28);

SELECT pepsi.register_stages(1, ARRAY['s'], NULL, NULL, NULL, NULL, NULL, NULL);
SELECT pepsi.enqueue('s') AS run1 \gset
SELECT count(*) FROM pepsi.claim(1, ARRAY['s'], ARRAY[1]);
INSERT INTO pepsi.workqueue (stage, status, state) VALUES ('s', 'failed', '{"error": "x 1"}')
RETURNING workqueue_id AS failed1 \gset
INSERT INTO pepsi.config (section, option, value) VALUES ('stage-s', 'WORKER_DSN', 'postgresql://u:secret@h/db');

SET LOCAL ROLE pepsi_operator;
SELECT ok(pepsi.enqueue('s', '{"by": "operator"}') > 0, 'operator can enqueue');
SELECT is((SELECT count(*)::int FROM pepsi.enqueue_many('s', ARRAY['{}', '{}']::jsonb[])), 2,
          'operator can enqueue_many');
SELECT ok((SELECT count(*) FROM pepsi.workqueue) > 0, 'operator can read the queue');
SELECT ok((SELECT count(*) FROM pepsi.list_messages()) > 0, 'operator can list');
SELECT is((SELECT status FROM pepsi.message_story(:run1)), 'running', 'operator can show');
SELECT lives_ok(format('SELECT * FROM pepsi.message_history(%s)', :run1), 'operator can read a history');
SELECT lives_ok('SELECT * FROM pepsi.failed_reasons()', 'operator can group failures');
SELECT lives_ok('SELECT * FROM pepsi.failed_messages()', 'operator can list failures');
SELECT lives_ok('SELECT * FROM pepsi.queue_counts()', 'operator can count (status)');
SELECT lives_ok('SELECT * FROM pepsi.queue_overview()', 'operator can read the overview');
SELECT is((SELECT stage FROM pepsi.get_message(:run1)), 's', 'operator can read a message by id (0040)');
SELECT lives_ok(format('SELECT * FROM pepsi.get_messages(ARRAY[%s]::bigint[])', :run1), 'and several');
SELECT is(pepsi.requeue_failed('s', ARRAY[:failed1]::bigint[]), 1, 'operator can requeue');
SELECT ok(pepsi.cancel(NULL, 's') >= 1, 'operator can cancel (pending rows only)');
SELECT ok(pepsi.purge(ARRAY['failed'], 's') >= 1, 'operator can purge');
SELECT ok(pepsi.schema_version() IS NOT NULL, 'operator can read the schema version');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :run1), 'running',
          'cancel left the running row alone');
SELECT throws_ok($$SELECT * FROM pepsi.claim(1, ARRAY['s'], ARRAY[1])$$, '42501', NULL, 'operator cannot claim');
SELECT throws_ok(format('SELECT pepsi.release(1, ARRAY[%s]::bigint[])', :run1), '42501', NULL, 'operator cannot release');
SELECT throws_ok('SELECT * FROM pepsi.reset_orphans(1, false, NULL)', '42501', NULL, 'operator cannot reset orphans');
SELECT throws_ok(format($$SELECT pepsi.finish(%s, 's')$$, :run1), '42501', NULL, 'operator cannot finish a running row');
SELECT throws_ok(format($$SELECT pepsi.fail(%s, 's', 'x')$$, :run1), '42501', NULL, 'operator cannot fail a running row');
SELECT throws_ok(format($$SELECT * FROM pepsi.record_dispatch_error(1, ARRAY[%s]::bigint[], ARRAY['failed'], ARRAY['x'])$$, :run1),
                 '42501', NULL, 'operator cannot record a dispatch error');
SELECT throws_ok(format($$UPDATE pepsi.workqueue SET status = 'done', dispatcher_id = NULL WHERE workqueue_id = %s$$, :run1),
                 '42501', NULL, 'operator cannot write the table');
SELECT throws_ok('SELECT * FROM pepsi.config', '42501', NULL, 'operator cannot read the overlay (passwords)');
SELECT throws_ok('SELECT * FROM pepsi.stage_config()', '42501', NULL, 'nor through stage_config');
RESET ROLE;

SELECT version_num AS head FROM public.alembic_version \gset
SET LOCAL ROLE pepsi_dispatcher;
SELECT is(pepsi.schema_version(), :'head', 'the dispatcher''s role reads the schema version (serve --check)');
RESET ROLE;
SET LOCAL ROLE pepsi_dashboard;
SELECT ok(pepsi.schema_version() IS NOT NULL, 'so does the dashboard''s');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
