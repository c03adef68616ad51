-- pepsi.stage_health()
--   → table(stage text, state text, cause text, since timestamptz,
--           held_seconds double precision, pending bigint, dispatchers bigint)
--   The health of every stage, as the live dispatchers report it with their
--   heartbeat (pepsi.heartbeat's gauges -> 'stages' -> NAME, an object
--   {"state": S, "cause": C, "held_seconds": N}), one row per stage of the
--   registry (pepsi.stages) and per stage a live dispatcher reports:
--     state    serving    the stage can start workers;
--              held_off   new workers are held off after a failure (a PROGRAM
--                         that cannot start, a worker that died before
--                         answering, exit 75, a failing claim); workers
--                         already running keep serving;
--              no_worker  held off, and no worker of the stage is running:
--                         nothing serves its rows;
--              paused     PAUSED (claims nothing);
--              unknown    no live dispatcher reports the stage.
--     cause    why it is held off (NULL otherwise);
--     since    when the hold-off began (the reporting dispatcher's heartbeat
--              time minus its held_seconds, so no clocks are compared);
--     held_seconds   now() - since;
--     pending  its pending rows (the pending index);
--     dispatchers    live dispatchers that report the stage.
--   With several live dispatchers the worst state wins (no_worker, held_off,
--   paused, serving), the earliest since among those.  Live means the rule
--   of dashboard_snapshot and queue_overview (v2): the dispatcher's session
--   is there (pepsi._dispatcher_live), whatever its heartbeat's age.
--   A state that is not one of the four, or a non-number held_seconds, is
--   read as serving / 0 (a newer dispatcher's report never breaks this).
--   Reads: pepsi.stages, pepsi.dispatchers, pepsi.workqueue
--   (workqueue_pending_idx).  Writes: nothing.  Locks: none.
--   Callers: pepsi_dispatcher, pepsi_operator (SECURITY DEFINER; pepsi-queue status;
--   pepsi-httpd's /healthz, /metrics and dashboard through dashboard_snapshot).
CREATE OR REPLACE FUNCTION pepsi.stage_health()
RETURNS TABLE (stage text, state text, cause text, since timestamptz,
               held_seconds double precision, pending bigint, dispatchers bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    WITH live AS (
        SELECT d.heartbeat_at, d.gauges -> 'stages' AS stages
          FROM pepsi.dispatchers AS d
         WHERE jsonb_typeof(d.gauges -> 'stages') = 'object'
           AND pepsi._dispatcher_live(d.dispatcher_id)
    ), reports AS (
        SELECT r.key AS stage,
               CASE WHEN r.value ->> 'state' IN ('serving', 'held_off', 'no_worker', 'paused')
                    THEN r.value ->> 'state' ELSE 'serving' END AS state,
               r.value ->> 'cause' AS cause,
               l.heartbeat_at - make_interval(secs => CASE
                   WHEN jsonb_typeof(r.value -> 'held_seconds') = 'number'
                   THEN (r.value ->> 'held_seconds')::float8 ELSE 0 END) AS since
          FROM live AS l
         CROSS JOIN LATERAL jsonb_each(l.stages) AS r
         WHERE jsonb_typeof(r.value) = 'object'
    ), worst AS (
        SELECT DISTINCT ON (r.stage) r.stage, r.state,
               CASE WHEN r.state IN ('held_off', 'no_worker') THEN r.cause END AS cause,
               CASE WHEN r.state IN ('held_off', 'no_worker') THEN r.since END AS since,
               count(*) OVER (PARTITION BY r.stage) AS n
          FROM reports AS r
         ORDER BY r.stage,
                  CASE r.state WHEN 'no_worker' THEN 0 WHEN 'held_off' THEN 1
                               WHEN 'paused' THEN 2 ELSE 3 END,
                  r.since
    ), names AS (
        SELECT s.stage FROM pepsi.stages AS s
        UNION SELECT w.stage FROM worst AS w
    )
    SELECT n.stage, coalesce(w.state, 'unknown'), w.cause, w.since,
           extract(epoch FROM now() - w.since)::float8,
           (SELECT count(*) FROM pepsi.workqueue AS q
             WHERE q.stage = n.stage AND q.status = 'pending'),
           coalesce(w.n, 0)
      FROM names AS n
      LEFT JOIN worst AS w ON w.stage = n.stage
     ORDER BY n.stage;
END
$$;
