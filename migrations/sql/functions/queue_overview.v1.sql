-- pepsi.queue_overview()
--   → table(stage text, pending bigint, running bigint, paused bigint, done bigint,
--           failed bigint, timeout bigint, expired bigint,
--           oldest_pending interval, next_due interval, done_last_minute bigint,
--           processed_total bigint, failed_total bigint, timeouts_total bigint,
--           crashes_total bigint, processing_seconds double precision,
--           registered boolean, parallelism int, queue_limit int)
--   One row per stage that has rows, statistics or a registration, sorted:
--     pending … expired   live counts by status;
--     oldest_pending      how long the longest-waiting pending row has waited
--                         at this stage (now() - its updated_at, i.e. since it
--                         became pending there); NULL when none is pending;
--     next_due            until the earliest finite timeout of its paused rows;
--     done_last_minute    rows that finished ('done') at this stage in the
--                         last 60 s (a live throughput that does not wait for
--                         the dispatcher's statistics flush);
--     *_total, processing_seconds   pepsi.stage_stats totals (flushed by the
--                         dispatcher every STATS_INTERVAL and when idle);
--     registered, parallelism, queue_limit   from the stage registry.
--   Clients compute rates from two calls' totals.
--   Reads: pepsi.workqueue (a full scan, like queue_counts: for operators,
--   not for hot paths), pepsi.stage_stats, pepsi.stages.  Locks: none.
--   Callers: pepsi_dispatcher (operators use that role; SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.queue_overview()
RETURNS TABLE (stage text, pending bigint, running bigint, paused bigint, done bigint,
               failed bigint, timeout bigint, expired bigint,
               oldest_pending interval, next_due interval, done_last_minute bigint,
               processed_total bigint, failed_total bigint, timeouts_total bigint,
               crashes_total bigint, processing_seconds double precision,
               registered boolean, parallelism integer, queue_limit integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    WITH live AS (
        SELECT w.stage,
               count(*) FILTER (WHERE w.status = 'pending') AS pending,
               count(*) FILTER (WHERE w.status = 'running') AS running,
               count(*) FILTER (WHERE w.status = 'paused') AS paused,
               count(*) FILTER (WHERE w.status = 'done') AS done,
               count(*) FILTER (WHERE w.status = 'failed') AS failed,
               count(*) FILTER (WHERE w.status = 'timeout') AS timeout,
               count(*) FILTER (WHERE w.status = 'expired') AS expired,
               now() - min(w.updated_at) FILTER (WHERE w.status = 'pending') AS oldest_pending,
               min(w.timeout) FILTER (WHERE w.status = 'paused' AND isfinite(w.timeout))
                   - now() AS next_due,
               count(*) FILTER (WHERE w.status = 'done'
                                  AND w.updated_at > now() - interval '60 s') AS done_1m
          FROM pepsi.workqueue AS w
         GROUP BY w.stage
    ), names AS (
        SELECT l.stage FROM live AS l
        UNION SELECT ss.stage FROM pepsi.stage_stats AS ss
        UNION SELECT s.stage FROM pepsi.stages AS s
    )
    SELECT n.stage,
           coalesce(l.pending, 0), coalesce(l.running, 0), coalesce(l.paused, 0),
           coalesce(l.done, 0), coalesce(l.failed, 0), coalesce(l.timeout, 0),
           coalesce(l.expired, 0), l.oldest_pending, l.next_due, coalesce(l.done_1m, 0),
           coalesce(ss.processed, 0), coalesce(ss.failed, 0), coalesce(ss.timeouts, 0),
           coalesce(ss.crashes, 0), coalesce(ss.processing_seconds, 0),
           s.stage IS NOT NULL, s.parallelism, s.queue_limit
      FROM names AS n
      LEFT JOIN live AS l ON l.stage = n.stage
      LEFT JOIN pepsi.stage_stats AS ss ON ss.stage = n.stage
      LEFT JOIN pepsi.stages AS s ON s.stage = n.stage
     ORDER BY n.stage;
END
$$;
