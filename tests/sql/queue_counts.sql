-- pepsi.queue_counts (live depth) and pepsi.metrics() (0039): the contract's
-- Prometheus text for any HTTP front end, rendered from dashboard_snapshot()
-- with pepsi-httpd's names and help texts (the families and samples are
-- compared with pepsi-httpd's in tests/python/integration/test_metrics_sql_parity.py).
BEGIN;
SELECT plan(11);

INSERT INTO pepsi.stages (stage) VALUES ('idle');
INSERT INTO pepsi.workqueue (stage, status, dispatcher_id, timeout) VALUES
    ('fetch', 'pending', NULL, NULL), ('fetch', 'pending', NULL, NULL),
    ('fetch', 'running', 1, NULL), ('parse.v2', 'paused', NULL, now()),
    ('parse.v2', 'failed', NULL, NULL);
INSERT INTO pepsi.stage_stats (stage, processed, failed, timeouts, crashes, processing_seconds)
VALUES ('fetch', 7, 2, 1, 0, 1.5);
UPDATE pepsi.dispatch_stats SET stage_runs = 12, messages = 11;

SELECT results_eq('SELECT * FROM pepsi.queue_counts()',
    $$VALUES ('fetch'::text, 'pending'::text, 2::bigint), ('fetch', 'running', 1),
             ('parse.v2', 'failed', 1), ('parse.v2', 'paused', 1)$$,
    'queue_counts returns rows per stage and status, sorted');

SELECT function_returns('pepsi', 'metrics', ARRAY[]::text[], 'text',
    'pepsi.metrics() returns text');

CREATE TEMP TABLE m AS SELECT pepsi.metrics() AS t;

SELECT is((SELECT count(*)::int FROM regexp_matches((SELECT t FROM m), '^# HELP ', 'gn')),
          (SELECT count(*)::int FROM regexp_matches((SELECT t FROM m), '^# TYPE ', 'gn')),
          'every family has a HELP and a TYPE line');
SELECT is((SELECT count(*)::int FROM regexp_matches((SELECT t FROM m), '^# TYPE ', 'gn')), 14,
          '5 stage counters, 7 totals, the depth and the retries due');
SELECT matches((SELECT t FROM m), E'\npepsi_stage_processed_total\\{stage="fetch"\\} 7\n',
               'a stage counter, from stage_stats');
SELECT matches((SELECT t FROM m), E'\npepsi_stage_processing_seconds_total\\{stage="fetch"\\} 1.5\n',
               'processing seconds, fractional');
SELECT matches((SELECT t FROM m), E'\npepsi_queue_messages_total 11\n',
               'a dispatch total, from dispatch_stats');
SELECT matches((SELECT t FROM m),
               E'\npepsi_queue_depth\\{stage="fetch",status="pending"\\} 2\n',
               'depth by stage and status');
SELECT matches((SELECT t FROM m),
               E'\npepsi_queue_depth\\{stage="idle",status="pending"\\} 0\n',
               'a registered stage with no rows is exported at zero');
SELECT matches((SELECT t FROM m),
               E'\npepsi_queue_retries_due\\{stage="parse.v2"\\} 1\n',
               'paused rows whose time has come');
SELECT is(right((SELECT t FROM m), 1), E'\n', 'the text ends with a newline');

SELECT * FROM finish();
ROLLBACK;
