-- pepsi._live_stats() → table(stage text, processed bigint, failed bigint, timeouts bigint,
--                             crashes bigint, processing_seconds float8)
--   The statistics as they are now: pepsi.stage_stats plus the deltas each
--   live dispatcher has counted and not flushed yet (its gauges'
--   'unflushed' → 'stages', sent with its heartbeat within about a second of
--   a change).  A dispatcher writes a flush and its gauges without the
--   flushed deltas in one statement, so a delta is counted exactly once
--   whichever moment this reads: the counters only grow (unless a dispatcher
--   dies with deltas it never flushed; those are lost, as before), and rates
--   computed from them (the dashboard's chart, status --watch, Prometheus
--   rate() over pepsi_stage_*_total) follow what is done within seconds,
--   not STATS_INTERVAL.  One row per stage that has statistics.
--   Reads: pepsi.stage_stats, pepsi.dispatchers (gauges).  Locks: none.
--   Callers: granted to nobody (dashboard_snapshot, queue_overview call it).
CREATE OR REPLACE FUNCTION pepsi._live_stats()
RETURNS TABLE (stage text, processed bigint, failed bigint, timeouts bigint, crashes bigint,
               processing_seconds double precision)
LANGUAGE sql STABLE
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
    WITH unflushed AS (
        SELECT u.key AS stage,
               sum(coalesce((u.value ->> 'processed')::bigint, 0)) AS processed,
               sum(coalesce((u.value ->> 'failed')::bigint, 0)) AS failed,
               sum(coalesce((u.value ->> 'timeouts')::bigint, 0)) AS timeouts,
               sum(coalesce((u.value ->> 'crashes')::bigint, 0)) AS crashes,
               sum(coalesce((u.value ->> 'seconds')::float8, 0)) AS seconds
          FROM pepsi.dispatchers AS d
         CROSS JOIN LATERAL jsonb_each(
                   CASE WHEN jsonb_typeof(d.gauges -> 'unflushed' -> 'stages') = 'object'
                        THEN d.gauges -> 'unflushed' -> 'stages' ELSE '{}' END) AS u
         WHERE jsonb_typeof(u.value) = 'object'
           AND pepsi._dispatcher_live(d.dispatcher_id)
         GROUP BY u.key
    )
    SELECT coalesce(s.stage, u.stage),
           (coalesce(s.processed, 0) + coalesce(u.processed, 0))::bigint,
           (coalesce(s.failed, 0) + coalesce(u.failed, 0))::bigint,
           (coalesce(s.timeouts, 0) + coalesce(u.timeouts, 0))::bigint,
           (coalesce(s.crashes, 0) + coalesce(u.crashes, 0))::bigint,
           coalesce(s.processing_seconds, 0) + coalesce(u.seconds, 0)
      FROM pepsi.stage_stats AS s
      FULL JOIN unflushed AS u ON u.stage = s.stage
$$;
