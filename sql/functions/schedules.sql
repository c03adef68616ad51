-- pepsi.schedules()
--   → table(name text, stage text, spec text, last_tick timestamptz,
--           next_tick timestamptz, settled_through timestamptz, updated_at timestamptz)
--   Every schedule a dispatcher registered, by name: its stage and spec as
--   last registered, the last tick that enqueued a message, the next tick
--   (NULL: in no dispatcher's configuration any more).  For pepsi-queue
--   schedules.
--   Reads: pepsi.schedule_ticks.  Locks: none.
--   Callers: pepsi_dispatcher, pepsi_operator (SECURITY DEFINER; the dashboard
--   through pepsi.dashboard_schedules).
CREATE OR REPLACE FUNCTION pepsi.schedules()
RETURNS TABLE (name text, stage text, spec text, last_tick timestamptz, next_tick timestamptz,
               settled_through timestamptz, updated_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
    SELECT t.name, t.stage, t.spec, t.last_tick, t.next_tick, t.settled_through, t.updated_at
      FROM pepsi.schedule_ticks AS t
     ORDER BY t.name
$$;
