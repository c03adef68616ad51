-- pepsi.metrics (Prometheus text) and pepsi.queue_counts (live depth).
BEGIN;
SELECT plan(14);

SELECT pepsi.flush_stats(ARRAY['fetch', 'parse.v2'], ARRAY[5, 2]::bigint[], ARRAY[1, 0]::bigint[],
                         ARRAY[0, 1]::bigint[], ARRAY[0, 0]::bigint[], ARRAY[1.25, 3], 9, 9, 2, 1);
INSERT INTO pepsi.workqueue (stage, status, dispatcher_id, timeout) VALUES
    ('fetch', 'pending', NULL, NULL), ('fetch', 'pending', NULL, NULL),
    ('fetch', 'running', 1, NULL), ('parse.v2', 'paused', NULL, now()),
    ('parse.v2', 'failed', NULL, NULL);
SELECT pepsi.register_dispatcher('h', 1, false);

CREATE TEMP TABLE m AS
SELECT line FROM regexp_split_to_table(pepsi.metrics(), E'\n') AS line WHERE line <> '';

SELECT ok(right(pepsi.metrics(), 1) = E'\n', 'the exposition ends with a newline');
SELECT is_empty($$SELECT line FROM m WHERE line NOT LIKE '#%'
                    AND line !~ '^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*")*\})? -?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$'$$,
                'every sample line is `name{label="value",...} number`');
SELECT is_empty($$SELECT line FROM m WHERE line LIKE '#%'
                    AND line !~ '^# (HELP [a-zA-Z_:][a-zA-Z0-9_:]* .+|TYPE [a-zA-Z_:][a-zA-Z0-9_:]* (counter|gauge))$'$$,
                'every comment line is a HELP or TYPE line');
SELECT is_empty($$SELECT split_part(regexp_replace(line, '[{ ].*', ''), ' ', 1) AS name FROM m
                   WHERE line NOT LIKE '#%'
                  EXCEPT SELECT split_part(line, ' ', 3) FROM m WHERE line LIKE '# TYPE %'$$,
                'every sample belongs to a family with a TYPE line');
SELECT is_empty($$SELECT split_part(line, ' ', 3) FROM m WHERE line LIKE '# TYPE %'
                  EXCEPT SELECT split_part(line, ' ', 3) FROM m WHERE line LIKE '# HELP %'$$,
                'every family has a HELP line');
SELECT is((SELECT count(*)::int FROM (SELECT split_part(line, ' ', 3) FROM m WHERE line LIKE '# TYPE %'
                                      GROUP BY 1 HAVING count(*) > 1) x), 0,
          'no family is declared twice');
SELECT ok('pepsi_stage_processed_total{stage="fetch"} 5' IN (SELECT line FROM m), 'per-stage processed counter');
SELECT ok('pepsi_stage_processing_seconds_total{stage="fetch"} 1.25' IN (SELECT line FROM m),
          'per-stage processing seconds');
SELECT ok('pepsi_dispatch_stage_runs_total 9' IN (SELECT line FROM m), 'global stage_runs counter');
SELECT ok('pepsi_dispatch_failed_total 1' IN (SELECT line FROM m), 'global failed counter');
SELECT ok('pepsi_queue_depth{stage="fetch",status="pending"} 2' IN (SELECT line FROM m),
          'queue depth by stage and status');
SELECT ok('pepsi_dispatchers 1' IN (SELECT line FROM m), 'registered dispatchers gauge');

SELECT results_eq('SELECT * FROM pepsi.queue_counts()',
    $$VALUES ('fetch'::text, 'pending'::text, 2::bigint), ('fetch', 'running', 1),
             ('parse.v2', 'failed', 1), ('parse.v2', 'paused', 1)$$,
    'queue_counts returns rows per stage and status, sorted');

TRUNCATE pepsi.workqueue, pepsi.attempts, pepsi.tracebacks, pepsi.stage_stats, pepsi.dispatchers;
SELECT ok(pepsi.metrics() ~ '# TYPE pepsi_queue_depth gauge' AND pepsi.metrics() ~ 'pepsi_dispatch_messages_total 9',
          'an empty queue still exposes every family');

SELECT * FROM finish();
ROLLBACK;
