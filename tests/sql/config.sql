-- pepsi.config, the database overlay, and its change trigger.
-- (That a change really notifies 'config_changed' is observed from pytest,
-- tests/python/integration/test_sql_notify.py: a notification is only sent at commit.)
BEGIN;
SELECT plan(9);

SELECT has_table('pepsi', 'config', 'the overlay table exists');
SELECT columns_are('pepsi', 'config', ARRAY['section', 'option', 'value'], 'it has section, option, value');
SELECT trigger_is('pepsi', 'config', 'config_notify_change', 'pepsi', '_notify_config',
                  'insert, update and delete notify through pepsi._notify_config');
SELECT trigger_is('pepsi', 'config', 'config_notify_truncate', 'pepsi', '_notify_config',
                  'truncate notifies too');
SELECT is((SELECT tgtype & 1 FROM pg_trigger WHERE tgname = 'config_notify_change')::int, 0,
          'the config trigger is statement-level');
SELECT trigger_is('pepsi', 'workqueue', 'workqueue_notify_insert', 'pepsi', '_notify_workqueue',
                  'an insert into workqueue notifies through pepsi._notify_workqueue');
SELECT is((SELECT tgtype & 1 FROM pg_trigger WHERE tgname = 'workqueue_notify_insert')::int, 0,
          'the workqueue trigger is statement-level (one NOTIFY per bulk insert)');

SELECT lives_ok($$INSERT INTO pepsi.config VALUES ('stage-fetch', 'PARALLELISM', '8')$$,
                'an overlay value can be inserted');
SELECT throws_ok($$INSERT INTO pepsi.config VALUES ('stage-fetch', 'PARALLELISM', '9')$$,
                 '23505', NULL, 'one value per section and option');

SELECT * FROM finish();
ROLLBACK;
