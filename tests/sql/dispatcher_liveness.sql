-- Migration 0014: one liveness rule for dispatchers in dashboard_snapshot v2,
-- queue_dispatchers v2 and queue_overview v2: live while the heartbeat is no
-- older than 3 × the heartbeat_interval of its gauges, else than the fallback
-- (dashboard_snapshot's live_within, 5 minutes elsewhere), at least 10 s.
-- dashboard_snapshot v1 fails the fallback tests: greatest(10.0, NULL) is
-- 10, so its coalesce(…, live_within) never reached live_within.
BEGIN;
SELECT plan(16);

CREATE FUNCTION pg_temp.snap_live(d bigint, live_within interval DEFAULT '5 minutes')
RETURNS boolean LANGUAGE sql AS $$
    SELECT (e ->> 'live')::boolean
      FROM jsonb_array_elements(pepsi.dashboard_snapshot(live_within) -> 'dispatchers') AS e
     WHERE (e ->> 'dispatcher_id')::bigint = d $$;
CREATE FUNCTION pg_temp.cli_live(d bigint) RETURNS boolean LANGUAGE sql AS $$
    SELECT live FROM pepsi.queue_dispatchers() WHERE dispatcher_id = d $$;
CREATE FUNCTION pg_temp.overview_live(d bigint) RETURNS boolean LANGUAGE sql AS $$
    SELECT coalesce((SELECT dispatchers > 0 FROM pepsi.queue_overview() WHERE stage = 'live_' || d), false) $$;
CREATE FUNCTION pg_temp.beat(d bigint, gauges jsonb, age interval) RETURNS void LANGUAGE sql AS $$
    UPDATE pepsi.dispatchers
       SET gauges = beat.gauges || jsonb_build_object('workers',
               jsonb_build_object('live_' || d, '{"busy": 1}'::jsonb)),
           heartbeat_at = now() - age
     WHERE dispatcher_id = d $$;

SELECT pepsi.register_dispatcher('h', 1, false) AS d \gset

-- No heartbeat_interval in the gauges (none sent yet, or an older dispatcher):
-- the fallback, 5 minutes by default.
SELECT pg_temp.beat(:d, '{}', '60 s');
SELECT is(pg_temp.snap_live(:d), true,
          'dashboard_snapshot: gauges without an interval, beat 60 s ago: live (within live_within)');
SELECT is(pg_temp.cli_live(:d), true, 'queue_dispatchers: the same');
SELECT is(pg_temp.overview_live(:d), true, 'queue_overview: the same');
SELECT is(pg_temp.snap_live(:d, '30 s'), false, 'dashboard_snapshot: older than live_within: not live');
SELECT pg_temp.beat(:d, '{}', '6 minutes');
SELECT is(pg_temp.snap_live(:d), false, 'dashboard_snapshot: beat 6 minutes ago: not live');
SELECT is(pg_temp.cli_live(:d), false, 'queue_dispatchers: the same');
SELECT is(pg_temp.overview_live(:d), false, 'queue_overview: the same');
-- A heartbeat_interval that is not a number counts as none (and breaks nothing).
SELECT pg_temp.beat(:d, '{"heartbeat_interval": "soon"}', '60 s');
SELECT is(pg_temp.snap_live(:d), true, 'dashboard_snapshot: a non-number interval counts as none');
SELECT is(pg_temp.cli_live(:d), true, 'queue_dispatchers: the same');

-- With an interval: 3 × it, at least 10 s.
SELECT pg_temp.beat(:d, '{"heartbeat_interval": 20}', '50 s');
SELECT is(pg_temp.snap_live(:d), true, 'dashboard_snapshot: within 3 × its interval: live');
SELECT is(pg_temp.cli_live(:d), true, 'queue_dispatchers: the same');
SELECT pg_temp.beat(:d, '{"heartbeat_interval": 20}', '70 s');
SELECT is(pg_temp.snap_live(:d), false, 'dashboard_snapshot: older than 3 × its interval: not live');
SELECT is(pg_temp.cli_live(:d), false, 'queue_dispatchers: the same');
SELECT is(pg_temp.overview_live(:d), false, 'queue_overview: the same');
SELECT pg_temp.beat(:d, '{"heartbeat_interval": 1}', '8 s');
SELECT is(pg_temp.snap_live(:d, '1 s'), true, 'dashboard_snapshot: 3 × 1 s is raised to 10 s');
SELECT is(pg_temp.cli_live(:d), true, 'queue_dispatchers: the same');

SELECT * FROM finish();
ROLLBACK;
