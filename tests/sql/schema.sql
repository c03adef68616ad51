-- The schema (docs/SQL.md, Schema): tables, columns, indexes, invariants as CHECKs.
BEGIN;
SELECT plan(30);

SELECT has_schema('pepsi', 'schema pepsi exists');
SELECT has_table('pepsi', t, format('table pepsi.%s exists', t))
  FROM unnest(ARRAY['workqueue', 'stage_stats', 'dispatch_stats', 'config', 'dispatchers']) AS t;
SELECT columns_are('pepsi', 'workqueue',
    ARRAY['workqueue_id', 'stage', 'status', 'payload', 'state', 'timeout', 'retries',
          'created_at', 'updated_at', 'dispatcher_id', 'priority', 'dedupe_key'],
    'workqueue has exactly the documented columns');
SELECT col_is_pk('pepsi', 'workqueue', 'workqueue_id', 'workqueue_id is the primary key');
SELECT col_default_is('pepsi', 'workqueue', 'status', 'pending', 'status defaults to pending');
SELECT col_default_is('pepsi', 'workqueue', 'payload', '{}', 'payload defaults to {}');
SELECT has_index('pepsi', 'workqueue', 'workqueue_pending_idx', 'the claim index exists');
SELECT is(pg_get_indexdef('pepsi.workqueue_pending_idx'::regclass),
          'CREATE INDEX workqueue_pending_idx ON pepsi.workqueue USING btree (stage, priority DESC, workqueue_id) WHERE (status = ''pending''::text)',
          'the claim index is (stage, priority DESC, workqueue_id) WHERE status = pending');
SELECT is(pg_get_indexdef('pepsi.workqueue_paused_idx'::regclass),
          'CREATE INDEX workqueue_paused_idx ON pepsi.workqueue USING btree (timeout) WHERE (status = ''paused''::text)',
          'the paused index is (timeout) WHERE status = paused');
SELECT has_index('pepsi', 'workqueue', 'workqueue_running_idx', 'running rows are indexed by dispatcher');
SELECT has_index('pepsi', 'workqueue', 'workqueue_done_idx', 'done rows are indexed for the purge');
SELECT ok((SELECT reloptions @> ARRAY['autovacuum_vacuum_scale_factor=0.01']
             FROM pg_class WHERE oid = 'pepsi.workqueue'::regclass),
          'workqueue is vacuumed after 1% dead rows, not 20%');
SELECT is((SELECT array_agg(c.relname::text ORDER BY c.relname)
             FROM pg_class AS c
            WHERE c.relnamespace = 'pepsi'::regnamespace AND c.relkind = 'r'
              AND c.reloptions @> ARRAY['autovacuum_vacuum_threshold=0',
                                        'autovacuum_vacuum_scale_factor=0']),
          ARRAY['dispatch_stats', 'dispatchers', 'schedule_ticks', 'stage_stats', 'stages'],
          'the small tables rewritten in place are vacuumed at their first dead row');

SELECT throws_ok($$INSERT INTO pepsi.workqueue (stage, status) VALUES ('a', 'bogus')$$,
                 '23514', NULL, 'an unknown status is refused');
SELECT throws_ok($$INSERT INTO pepsi.workqueue (stage) VALUES ('a b')$$,
                 '23514', NULL, 'a stage name outside [A-Za-z0-9_.-]+ is refused');
SELECT throws_ok($$INSERT INTO pepsi.workqueue (stage) VALUES ('')$$,
                 '23514', NULL, 'an empty stage name is refused');
SELECT throws_ok($$INSERT INTO pepsi.workqueue (stage, status) VALUES ('a', 'running')$$,
                 '23514', NULL, 'a running row without a dispatcher is refused');
SELECT throws_ok($$INSERT INTO pepsi.workqueue (stage, status, dispatcher_id) VALUES ('a', 'pending', 1)$$,
                 '23514', NULL, 'a pending row with a dispatcher is refused');
SELECT throws_ok($$INSERT INTO pepsi.workqueue (stage, status) VALUES ('a', 'paused')$$,
                 '23514', NULL, 'a paused row without a timeout is refused');
SELECT throws_ok($$INSERT INTO pepsi.workqueue (stage, retries) VALUES ('a', -1)$$,
                 '23514', NULL, 'negative retries are refused');
SELECT lives_ok($$INSERT INTO pepsi.workqueue (stage) VALUES ('Stage_1.x-y')$$,
                'letters, digits, _ . - make a valid stage name');

SELECT is((SELECT count(*)::int FROM pepsi.dispatch_stats), 1, 'dispatch_stats has one row');
SELECT throws_ok($$INSERT INTO pepsi.dispatch_stats (id) VALUES (false)$$,
                 '23514', NULL, 'dispatch_stats cannot get a second row (id false)');
SELECT throws_ok($$INSERT INTO pepsi.dispatch_stats DEFAULT VALUES$$,
                 '23505', NULL, 'dispatch_stats cannot get a second row (id true)');
SELECT col_is_pk('pepsi', 'config', ARRAY['section', 'option'], 'config key is (section, option)');
SELECT col_is_pk('pepsi', 'stage_stats', 'stage', 'stage_stats key is stage');

SELECT * FROM finish();
ROLLBACK;
