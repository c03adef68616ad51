-- pepsi.queue_overview()
--   → table(stage text, pending bigint, running bigint, paused bigint, done bigint,
--           failed bigint, timeout bigint, expired bigint,
--           oldest_pending interval, next_due interval, done_last_minute bigint,
--           processed_total bigint, failed_total bigint, timeouts_total bigint,
--           crashes_total bigint, processing_seconds double precision,
--           registered boolean, parallelism int, queue_limit int,
--           dispatchers bigint, workers bigint, workers_busy bigint,
--           workers_idle bigint, workers_retiring bigint, workers_stopping bigint)
--   One row per stage that has rows, statistics, a registration or live
--   workers, sorted:
--     pending … expired   live counts by status;
--     oldest_pending      how long the longest-waiting pending row has waited
--                         at this stage (now() - its updated_at, i.e. since it
--                         became pending there); NULL when none is pending;
--     next_due            until the earliest finite timeout of its paused rows;
--     done_last_minute    rows that finished ('done') at this stage in the
--                         last 60 s (a live throughput that does not wait for
--                         the dispatcher's statistics flush);
--     *_total, processing_seconds   the statistics as they are now
--                         (pepsi._live_stats: stage_stats plus the live
--                         dispatchers' unflushed deltas, within about a second);
--     registered, parallelism, queue_limit   from the stage registry;
--     dispatchers         live dispatchers whose gauges list the stage;
--     workers, workers_busy … workers_stopping   their worker processes of
--                         the stage (gauges -> 'workers' -> stage, by state:
--                         busy, idle, retiring, stopping; workers = all four),
--                         summed over live dispatchers; 0 when none is live.
--   A dispatcher is live while its session is there (pepsi._dispatcher_live,
--   the rule of queue_dispatchers and dashboard_snapshot), whatever its
--   heartbeat's age.  The worker counts are as old as that dispatcher's last
--   heartbeat.
--   Clients compute rates from two calls' totals.
--   Reads: pepsi.workqueue (a full scan, like queue_counts: for operators,
--   not for hot paths), pepsi.stage_stats, pepsi.stages, pepsi.dispatchers, pg_locks.
--   Writes: nothing.  Locks: none.
--   Callers: pepsi_dispatcher, pepsi_operator (SECURITY DEFINER; pepsi-queue: people
--   used the dispatcher's role before pepsi_operator existed).
CREATE OR REPLACE FUNCTION pepsi.queue_overview()
RETURNS TABLE (stage text, pending bigint, running bigint, paused bigint, done bigint,
               failed bigint, timeout bigint, expired bigint,
               oldest_pending interval, next_due interval, done_last_minute bigint,
               processed_total bigint, failed_total bigint, timeouts_total bigint,
               crashes_total bigint, processing_seconds double precision,
               registered boolean, parallelism integer, queue_limit integer,
               dispatchers bigint, workers bigint, workers_busy bigint,
               workers_idle bigint, workers_retiring bigint, workers_stopping bigint)
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
          FROM pepsi.messages AS w
         GROUP BY w.stage
    ), live_dispatchers AS (
        SELECT d.gauges -> 'workers' AS workers
          FROM pepsi.dispatchers AS d
         WHERE jsonb_typeof(d.gauges -> 'workers') = 'object'
           AND pepsi._dispatcher_live(d.dispatcher_id)
    ), gauged AS (
        SELECT ws.key AS stage,
               count(*) AS dispatchers,
               sum(coalesce((ws.value ->> 'busy')::bigint, 0))::bigint AS busy,
               sum(coalesce((ws.value ->> 'idle')::bigint, 0))::bigint AS idle,
               sum(coalesce((ws.value ->> 'retiring')::bigint, 0))::bigint AS retiring,
               sum(coalesce((ws.value ->> 'stopping')::bigint, 0))::bigint AS stopping
          FROM live_dispatchers AS ld
         CROSS JOIN LATERAL jsonb_each(CASE WHEN jsonb_typeof(ld.workers) = 'object'
                                            THEN ld.workers ELSE '{}' END) AS ws
         WHERE jsonb_typeof(ws.value) = 'object'
         GROUP BY ws.key
    ), names AS (
        SELECT l.stage FROM live AS l
        UNION SELECT ss.stage FROM pepsi._live_stats() AS ss
        UNION SELECT s.stage FROM pepsi.stages AS s
        UNION SELECT g.stage FROM gauged AS g
    )
    SELECT n.stage,
           coalesce(l.pending, 0), coalesce(l.running, 0), coalesce(l.paused, 0),
           coalesce(l.done, 0), coalesce(l.failed, 0), coalesce(l.timeout, 0),
           coalesce(l.expired, 0), l.oldest_pending, l.next_due, coalesce(l.done_1m, 0),
           coalesce(ss.processed, 0), coalesce(ss.failed, 0), coalesce(ss.timeouts, 0),
           coalesce(ss.crashes, 0), coalesce(ss.processing_seconds, 0),
           s.stage IS NOT NULL, s.parallelism, s.queue_limit,
           coalesce(g.dispatchers, 0),
           coalesce(g.busy + g.idle + g.retiring + g.stopping, 0),
           coalesce(g.busy, 0), coalesce(g.idle, 0), coalesce(g.retiring, 0),
           coalesce(g.stopping, 0)
      FROM names AS n
      LEFT JOIN live AS l ON l.stage = n.stage
      LEFT JOIN pepsi._live_stats() AS ss ON ss.stage = n.stage
      LEFT JOIN pepsi.stages AS s ON s.stage = n.stage
      LEFT JOIN gauged AS g ON g.stage = n.stage
     ORDER BY n.stage;
END
$$;
