-- pepsi.dashboard_schedules() → jsonb
--   The dashboard's schedules table: a JSON array of pepsi.schedules() rows
--   (name, stage, spec, last_tick, next_tick), ordered by name; [] when none.
--   Reads: pepsi.schedule_ticks.  Locks: none.
--   Callers: pepsi_dashboard (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.dashboard_schedules()
RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'name', s.name, 'stage', s.stage, 'spec', s.spec,
               'last_tick', s.last_tick, 'next_tick', s.next_tick) ORDER BY s.name), '[]')
      FROM pepsi.schedules() AS s
$$;
