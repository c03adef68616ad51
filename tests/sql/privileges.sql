-- Least privilege: each role can do its part and nothing else.
BEGIN;
SELECT plan(35);

SELECT has_role(r, format('role %s exists', r))
  FROM unnest(ARRAY['pepsi_dispatcher', 'pepsi_stage', 'pepsi_ingress']) AS r;
SELECT ok(NOT rolcanlogin, format('role %s cannot log in', rolname))
  FROM pg_roles WHERE rolname IN ('pepsi_dispatcher', 'pepsi_stage', 'pepsi_ingress') ORDER BY rolname;

SELECT is_empty($$SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                   WHERE n.nspname = 'pepsi' AND has_function_privilege('public', p.oid, 'EXECUTE')$$,
                'PUBLIC can execute no pepsi function');
SELECT is_empty($$SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                   WHERE n.nspname = 'pepsi' AND p.prokind = 'f' AND p.prorettype <> 'trigger'::regtype
                     AND p.proname NOT LIKE '\_%'
                     AND (NOT p.prosecdef
                          OR NOT coalesce(p.proconfig, '{}') @> ARRAY['search_path=pepsi, pg_catalog, pg_temp'])$$,
                'every API function is SECURITY DEFINER with a pinned search_path');

-- Claim something to work with, as the owner.
SELECT pepsi.enqueue('s') AS id1 \gset
SELECT count(*) FROM pepsi.claim(1, ARRAY['s'], ARRAY[1]);

SET LOCAL ROLE pepsi_ingress;
SELECT ok(pepsi.enqueue('s', '{"from": "ingress"}') > 0, 'ingress can enqueue');
SELECT ok((SELECT count(*) FROM pepsi.enqueue_many('s', ARRAY['{}']::jsonb[])) = 1, 'ingress can enqueue_many');
SELECT throws_ok(format($$SELECT pepsi.advance(%s, 's', 't', 1)$$, :id1), '42501', NULL, 'ingress cannot advance');
SELECT throws_ok(format($$SELECT pepsi.finish(%s, 's')$$, :id1), '42501', NULL, 'ingress cannot finish');
SELECT throws_ok(format('SELECT * FROM pepsi.get_message(%s)', :id1), '42501', NULL, 'ingress cannot read messages');
SELECT throws_ok($$SELECT * FROM pepsi.claim(1, ARRAY['s'], ARRAY[1])$$, '42501', NULL, 'ingress cannot claim');
SELECT throws_ok('SELECT count(*) FROM pepsi.workqueue', '42501', NULL, 'ingress cannot read the table');
SELECT lives_ok($$INSERT INTO pepsi.workqueue (stage, payload, priority) VALUES ('s', '{}', 2)$$,
                'ingress may insert the three columns an enqueue sets (its COPY path)');
SELECT throws_ok($$INSERT INTO pepsi.workqueue (stage, status) VALUES ('s', 'running')$$, '42501', NULL,
                 'ingress cannot set a status');
SELECT throws_ok($$INSERT INTO pepsi.workqueue (stage, dedupe_key, retries) VALUES ('s', 'k', 0)$$,
                 '42501', NULL, 'ingress cannot set a retry count');
SELECT throws_ok($$INSERT INTO pepsi.workqueue (workqueue_id, stage) OVERRIDING SYSTEM VALUE
                   VALUES (1000000, 's')$$, '42501', NULL, 'ingress cannot choose an id');
RESET ROLE;

SET LOCAL ROLE pepsi_stage;
SELECT is((SELECT stage FROM pepsi.get_message(:id1)), 's', 'a stage can read a message');
SELECT is((SELECT count(*)::int FROM pepsi.get_messages(ARRAY[:id1]::bigint[])), 1, 'a stage can read messages');
SELECT is(pepsi.set_state(:id1, 's', '{"x": 1}', 1), true, 'a stage can set state');
SELECT is(pepsi.advance(:id1, 's', 't', 1), true, 'a stage can advance');
SELECT ok(pepsi.enqueue('t') > 0, 'a stage can enqueue');
SELECT throws_ok($$SELECT * FROM pepsi.claim(1, ARRAY['t'], ARRAY[1])$$, '42501', NULL, 'a stage cannot claim');
SELECT throws_ok($$SELECT * FROM pepsi.requeue_due(NULL, NULL, 1, '1 h')$$, '42501', NULL,
                 'a stage cannot requeue');
SELECT throws_ok('SELECT pepsi.release(1)', '42501', NULL, 'a stage cannot release');
SELECT throws_ok('SELECT * FROM pepsi.queue_counts()', '42501', NULL, 'a stage cannot read the queue counts');
SELECT throws_ok($$UPDATE pepsi.workqueue SET status = 'done'$$, '42501', NULL,
                 'a stage cannot update the table directly');
RESET ROLE;

SET LOCAL ROLE pepsi_dispatcher;
SELECT is((SELECT count(*)::int FROM pepsi.claim(2, ARRAY['t'], ARRAY[1])), 1, 'the dispatcher can claim');
SELECT ok((SELECT count(*) FROM pepsi.queue_counts()) > 0, 'the dispatcher can read the queue counts');
SELECT ok((SELECT count(*) FROM pepsi.workqueue) > 0, 'the dispatcher can read the table');
SELECT throws_ok($$SELECT pepsi.advance(1, 't', 'u')$$, '42501', NULL,
                 'the dispatcher cannot move a row forward (only a stage can)');
SELECT throws_ok($$DELETE FROM pepsi.workqueue$$, '42501', NULL, 'the dispatcher cannot delete directly');
SELECT throws_ok($$INSERT INTO pepsi.config VALUES ('stage-x', 'PROGRAM', 'y')$$, '42501', NULL,
                 'the dispatcher cannot change the configuration overlay');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
