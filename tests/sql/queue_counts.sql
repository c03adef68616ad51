-- pepsi.queue_counts (live depth).  The Prometheus text is pepsi-httpd's
-- /metrics alone (pepsi_dispatch/httpd/exposition.py); no SQL function
-- renders it (tests/python/unit/test_metrics_one_source.py).
BEGIN;
SELECT plan(2);

INSERT INTO pepsi.workqueue (stage, status, dispatcher_id, timeout) VALUES
    ('fetch', 'pending', NULL, NULL), ('fetch', 'pending', NULL, NULL),
    ('fetch', 'running', 1, NULL), ('parse.v2', 'paused', NULL, now()),
    ('parse.v2', 'failed', NULL, NULL);

SELECT results_eq('SELECT * FROM pepsi.queue_counts()',
    $$VALUES ('fetch'::text, 'pending'::text, 2::bigint), ('fetch', 'running', 1),
             ('parse.v2', 'failed', 1), ('parse.v2', 'paused', 1)$$,
    'queue_counts returns rows per stage and status, sorted');
SELECT hasnt_function('pepsi', 'metrics', 'pepsi.metrics() is gone: /metrics is pepsi-httpd''s');

SELECT * FROM finish();
ROLLBACK;
