-- pepsi.metrics() → text
--   Prometheus text exposition (version 0.0.4) of:
--     pepsi_stage_{processed,failed,timeouts,crashes}_total{stage}   counters
--     pepsi_stage_processing_seconds_total{stage}                    counter
--     pepsi_dispatch_{stage_runs,messages,failed,timeouts,crashes,requeued,expired}_total
--     pepsi_queue_depth{stage,status}                                gauge (live rows;
--         (v2) every stage of the registry or with rows, times every status,
--         zeros included)
--     pepsi_dispatchers                                              gauge (registered)
--   Every metric family has its # HELP and # TYPE lines, even when empty.
--   Stage names need no label escaping: they match [A-Za-z0-9_.-]+.
--   Reads: stage_stats, dispatch_stats, dispatchers, workqueue (queue depth
--   is a full count, like queue_counts()).  Writes: nothing.  Locks: none.
--   Callers: pepsi_dispatcher (SECURITY DEFINER), for any HTTP front end.
--
-- Why v2: a stage's series vanished once it drained (no row, no sample), so
--   rate() and alerts on it broke; v2 exports zeros.  Same signature.
CREATE OR REPLACE FUNCTION pepsi.metrics()
RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    out text := '';
    fam record;
    g pepsi.dispatch_stats;
BEGIN
    -- Per-stage counters.
    FOR fam IN
        SELECT * FROM (VALUES
            ('processed', 'Messages a stage processed successfully.'),
            ('failed', 'Messages that failed at a stage.'),
            ('timeouts', 'Messages that hit MAX_RUNTIME at a stage.'),
            ('crashes', 'Worker crashes at a stage.'),
            ('processing_seconds', 'Seconds workers of a stage spent on messages.')
        ) AS v(col, help)
    LOOP
        out := out || format(E'# HELP pepsi_stage_%s_total %s\n# TYPE pepsi_stage_%s_total counter\n',
                             fam.col, fam.help, fam.col);
        out := out || coalesce((
            SELECT string_agg(format(E'pepsi_stage_%s_total{stage="%s"} %s\n', fam.col, s.stage,
                                     CASE fam.col
                                         WHEN 'processed' THEN s.processed::text
                                         WHEN 'failed' THEN s.failed::text
                                         WHEN 'timeouts' THEN s.timeouts::text
                                         WHEN 'crashes' THEN s.crashes::text
                                         ELSE s.processing_seconds::text END),
                              '' ORDER BY s.stage)
              FROM pepsi.stage_stats AS s), '');
    END LOOP;

    -- Global counters.
    SELECT * INTO g FROM pepsi.dispatch_stats AS d WHERE d.id;
    FOR fam IN
        SELECT * FROM (VALUES
            ('stage_runs', 'Stage executions, fused ones included.', g.stage_runs),
            ('messages', 'Message ids handed to workers.', g.messages),
            ('failed', 'Messages failed, all stages.', g.failed),
            ('timeouts', 'Messages timed out, all stages.', g.timeouts),
            ('crashes', 'Worker crashes, all stages.', g.crashes),
            ('requeued', 'Paused messages flipped back to pending.', g.requeued),
            ('expired', 'Messages expired (older than EXPIRY).', g.expired)
        ) AS v(name, help, value)
    LOOP
        out := out || format(E'# HELP pepsi_dispatch_%s_total %s\n# TYPE pepsi_dispatch_%s_total counter\npepsi_dispatch_%s_total %s\n',
                             fam.name, fam.help, fam.name, fam.name, coalesce(fam.value, 0));
    END LOOP;

    -- Live queue depth.
    out := out || E'# HELP pepsi_queue_depth Rows in pepsi.workqueue by stage and status.\n'
               || E'# TYPE pepsi_queue_depth gauge\n';
    out := out || coalesce((
        SELECT string_agg(format(E'pepsi_queue_depth{stage="%s",status="%s"} %s\n',
                                 q.stage, q.status, q.n), '' ORDER BY q.stage, q.status)
          FROM (WITH r AS (SELECT w.stage, w.status, count(*) AS n  -- one scan
                             FROM pepsi.messages AS w
                            GROUP BY w.stage, w.status)
                SELECT n.stage, st.status, coalesce(r.n, 0) AS n
                  FROM (SELECT r.stage FROM r UNION SELECT s.stage FROM pepsi.stages AS s) AS n
                 CROSS JOIN unnest(ARRAY['pending', 'running', 'paused', 'done', 'failed',
                                         'timeout', 'expired']) AS st(status)
                  LEFT JOIN r ON r.stage = n.stage AND r.status = st.status) AS q), '');

    out := out || E'# HELP pepsi_dispatchers Registered dispatchers.\n'
               || E'# TYPE pepsi_dispatchers gauge\n'
               || format(E'pepsi_dispatchers %s\n', (SELECT count(*) FROM pepsi.dispatchers));
    RETURN out;
END
$$;
