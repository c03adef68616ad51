-- pepsi.register_schedules(names text[], stages text[], specs text[],
--                          next_ticks timestamptz[])
--   → table(name text, last_tick timestamptz, settled_through timestamptz)
--   A dispatcher's [schedule-NAME] sections, at start and on every reload
--   (arrays aligned).  A schedule seen for the first time is settled through
--   now(): its ticks before it was registered are never enqueued (no
--   backfill of a new schedule); one already known keeps its ticks and gets
--   the stage, spec (text for people) and next tick given.  Known schedules
--   missing from names get next_tick NULL (in no configuration any more)
--   but keep their row, so one put back later does not fire its past again.
--   Returns the known state of every schedule in names, from which the
--   dispatcher works out its missed ticks (CATCH_UP).
--   Raises 22023 when the arrays differ in length or a name is malformed.
--   Writes: pepsi.schedule_ticks.  Locks: the rows written.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.register_schedules(names text[], stages text[], specs text[],
                                                    next_ticks timestamptz[])
RETURNS TABLE (name text, last_tick timestamptz, settled_through timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    n integer := coalesce(cardinality(register_schedules.names), 0);
BEGIN
    IF coalesce(cardinality(register_schedules.stages), 0) <> n
       OR coalesce(cardinality(register_schedules.specs), 0) <> n
       OR coalesce(cardinality(register_schedules.next_ticks), 0) <> n THEN
        RAISE EXCEPTION 'register_schedules: names, stages, specs and next_ticks differ in length'
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT FROM unnest(register_schedules.names) AS x
                WHERE x IS NULL OR x !~ '^[A-Za-z0-9_.-]+$') THEN
        RAISE EXCEPTION 'register_schedules: schedule names match [A-Za-z0-9_.-]+'
            USING ERRCODE = '22023';
    END IF;
    UPDATE pepsi.schedule_ticks AS t
       SET next_tick = NULL, updated_at = now()
     WHERE t.next_tick IS NOT NULL AND NOT (t.name = ANY (coalesce(register_schedules.names, '{}')));
    INSERT INTO pepsi.schedule_ticks AS t (name, stage, spec, next_tick, settled_through)
    SELECT u.name, u.stage, u.spec, u.next_tick, now()
      FROM unnest(register_schedules.names, register_schedules.stages, register_schedules.specs,
                  register_schedules.next_ticks) AS u(name, stage, spec, next_tick)
     ORDER BY u.name
    ON CONFLICT (name) DO UPDATE
       SET stage = excluded.stage, spec = excluded.spec, next_tick = excluded.next_tick,
           updated_at = now();
    RETURN QUERY
    SELECT t.name, t.last_tick, t.settled_through
      FROM pepsi.schedule_ticks AS t
     WHERE t.name = ANY (register_schedules.names)
     ORDER BY t.name;
END
$$;
