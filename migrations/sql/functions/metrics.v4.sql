-- pepsi.metrics() → text
--   Prometheus text exposition (version 0.0.4) of the statistics and of the
--   live queue depth, for any HTTP front end other than pepsi-httpd:
--     pepsi_stage_{processed,failed,timeouts,crashes,processing_seconds}_total{stage}
--                                          counters, as stage_stats are now
--     pepsi_queue_{stage_runs,messages,failed,timeouts,crashes,requeued,expired}_total
--                                          counters, the dispatch_stats totals
--     pepsi_queue_depth{stage,status}      gauge: rows by stage and status, every
--                                          registered stage (or one with rows)
--                                          times every status, zeros included
--     pepsi_queue_retries_due{stage}       gauge: paused rows whose time has come
--   Every family has its # HELP and # TYPE lines, even when it has no sample.
--   Guarantees: the values are those of one pepsi.dashboard_snapshot() (the
--   live dispatchers' unflushed deltas included), and each family, its help
--   text and its samples are exactly those pepsi-httpd's /metrics serves for
--   the same snapshot (tests/python/integration/test_metrics_sql_parity.py
--   compares them); pepsi-httpd also exports what this cannot (the
--   dispatchers' gauges, stage health, oldest rows).  Stage names need no
--   label escaping: they match [A-Za-z0-9_.-]+.
--   Reads: what dashboard_snapshot reads (a full count of workqueue, like
--   queue_counts).  Writes: nothing.  Locks: none.
--   Callers: pepsi_dispatcher, pepsi_dashboard, pepsi_operator (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.metrics()
RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    snap jsonb := pepsi.dashboard_snapshot();
    out text := '';
    fam record;
BEGIN
    FOR fam IN
        SELECT * FROM (VALUES
            (1, 'processed', 'Messages a stage processed successfully.'),
            (2, 'failed', 'Messages that failed at a stage.'),
            (3, 'timeouts', 'Messages that hit MAX_RUNTIME at a stage.'),
            (4, 'crashes', 'Worker crashes at a stage.'),
            (5, 'processing_seconds', 'Seconds workers of a stage spent on messages.')
        ) AS v(ord, col, help)
        ORDER BY ord
    LOOP
        out := out || format(E'# HELP pepsi_stage_%s_total %s\n# TYPE pepsi_stage_%s_total counter\n',
                             fam.col, fam.help, fam.col);
        out := out || coalesce((
            SELECT string_agg(format(E'pepsi_stage_%s_total{stage="%s"} %s\n',
                                     fam.col, s ->> 'stage', s ->> fam.col),
                              '' ORDER BY s ->> 'stage')
              FROM jsonb_array_elements(snap -> 'stage_stats') AS s), '');
    END LOOP;

    FOR fam IN
        SELECT * FROM (VALUES
            (1, 'stage_runs', 'Stage executions, fused ones included.'),
            (2, 'messages', 'Message ids handed to workers.'),
            (3, 'failed', 'Messages failed, all stages.'),
            (4, 'timeouts', 'Messages timed out, all stages.'),
            (5, 'crashes', 'Worker crashes, all stages.'),
            (6, 'requeued', 'Paused messages flipped back to pending.'),
            (7, 'expired', 'Messages expired (older than EXPIRY).')
        ) AS v(ord, name, help)
        ORDER BY ord
    LOOP
        out := out || format(E'# HELP pepsi_queue_%s_total %s\n# TYPE pepsi_queue_%s_total counter\npepsi_queue_%s_total %s\n',
                             fam.name, fam.help, fam.name, fam.name,
                             coalesce(snap -> 'totals' ->> fam.name, '0'));
    END LOOP;

    out := out || E'# HELP pepsi_queue_depth Rows in pepsi.workqueue by stage and status.\n'
               || E'# TYPE pepsi_queue_depth gauge\n'
               || coalesce((
                   SELECT string_agg(format(E'pepsi_queue_depth{stage="%s",status="%s"} %s\n',
                                            q ->> 'stage', q ->> 'status', q ->> 'count'),
                                     '' ORDER BY q ->> 'stage', q ->> 'status')
                     FROM jsonb_array_elements(snap -> 'queue') AS q), '');

    out := out || E'# HELP pepsi_queue_retries_due Paused rows whose time has come (requeue_due flips them to pending).\n'
               || E'# TYPE pepsi_queue_retries_due gauge\n'
               || coalesce((
                   SELECT string_agg(format(E'pepsi_queue_retries_due{stage="%s"} %s\n',
                                            d.key, d.value), '' ORDER BY d.key)
                     FROM jsonb_each_text(snap -> 'retries_due') AS d), '');
    RETURN out;
END
$$;
