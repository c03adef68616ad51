-- pepsi.flush_stats(stages text[], processed bigint[], failed bigint[], timeouts bigint[],
--                   crashes bigint[], seconds float8[], stage_runs bigint, messages bigint,
--                   requeued bigint, expired bigint) → void
--   Adds the dispatcher's in-memory deltas to the totals, all in one call
--   (one transaction): per stage i, stage_stats[stages[i]] += (processed[i],
--   failed[i], timeouts[i], crashes[i], seconds[i]) — an upsert, a new stage
--   gets a row — and the single dispatch_stats row += (stage_runs, messages,
--   sum(failed), sum(timeouts), sum(crashes), requeued, expired).
--   NULL elements and NULL scalars count as 0; a stage named twice is summed;
--   stages whose deltas are all zero are not written, and nothing at all is
--   written when every delta is zero.
--   Raises 22023 when the arrays differ in length.
--   Writes: pepsi.stage_stats, pepsi.dispatch_stats.
--   Locks: the stage_stats rows touched and the dispatch_stats row.
--   Guarantees: totals only grow by the deltas given; never overwritten.
--   Callers: pepsi_dispatcher (SECURITY DEFINER), its only writer.
CREATE OR REPLACE FUNCTION pepsi.flush_stats(stages text[], processed bigint[],
                                             failed bigint[], timeouts bigint[],
                                             crashes bigint[], seconds double precision[],
                                             stage_runs bigint, messages bigint,
                                             requeued bigint, expired bigint)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    n integer := coalesce(cardinality(flush_stats.stages), 0);
    sum_failed bigint;
    sum_timeouts bigint;
    sum_crashes bigint;
BEGIN
    IF coalesce(cardinality(flush_stats.processed), n) <> n
       OR coalesce(cardinality(flush_stats.failed), n) <> n
       OR coalesce(cardinality(flush_stats.timeouts), n) <> n
       OR coalesce(cardinality(flush_stats.crashes), n) <> n
       OR coalesce(cardinality(flush_stats.seconds), n) <> n THEN
        RAISE EXCEPTION 'flush_stats: per-stage arrays differ in length'
            USING ERRCODE = '22023';
    END IF;

    WITH d AS (
        SELECT u.stage,
               sum(coalesce(u.p, 0))::bigint  AS p,
               sum(coalesce(u.f, 0))::bigint  AS f,
               sum(coalesce(u.t, 0))::bigint  AS t,
               sum(coalesce(u.c, 0))::bigint  AS c,
               sum(coalesce(u.s, 0))::float8  AS s
          FROM unnest(flush_stats.stages, flush_stats.processed, flush_stats.failed,
                      flush_stats.timeouts, flush_stats.crashes, flush_stats.seconds)
               AS u(stage, p, f, t, c, s)
         WHERE u.stage IS NOT NULL
         GROUP BY u.stage
    ), up AS (
        INSERT INTO pepsi.stage_stats AS ss
               (stage, processed, failed, timeouts, crashes, processing_seconds, updated_at)
        SELECT d.stage, d.p, d.f, d.t, d.c, d.s, now()
          FROM d
         WHERE d.p <> 0 OR d.f <> 0 OR d.t <> 0 OR d.c <> 0 OR d.s <> 0
        ON CONFLICT (stage) DO UPDATE
           SET processed = ss.processed + EXCLUDED.processed,
               failed = ss.failed + EXCLUDED.failed,
               timeouts = ss.timeouts + EXCLUDED.timeouts,
               crashes = ss.crashes + EXCLUDED.crashes,
               processing_seconds = ss.processing_seconds + EXCLUDED.processing_seconds,
               updated_at = now()
        RETURNING 1
    )
    SELECT coalesce(sum(d.f), 0), coalesce(sum(d.t), 0), coalesce(sum(d.c), 0)
      INTO sum_failed, sum_timeouts, sum_crashes
      FROM d;

    IF coalesce(flush_stats.stage_runs, 0) <> 0 OR coalesce(flush_stats.messages, 0) <> 0
       OR coalesce(flush_stats.requeued, 0) <> 0 OR coalesce(flush_stats.expired, 0) <> 0
       OR sum_failed <> 0 OR sum_timeouts <> 0 OR sum_crashes <> 0 THEN
        UPDATE pepsi.dispatch_stats AS g
           SET stage_runs = g.stage_runs + coalesce(flush_stats.stage_runs, 0),
               messages = g.messages + coalesce(flush_stats.messages, 0),
               failed = g.failed + sum_failed,
               timeouts = g.timeouts + sum_timeouts,
               crashes = g.crashes + sum_crashes,
               requeued = g.requeued + coalesce(flush_stats.requeued, 0),
               expired = g.expired + coalesce(flush_stats.expired, 0),
               updated_at = now()
         WHERE g.id;
    END IF;
END
$$;
