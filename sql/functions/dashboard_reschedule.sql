-- pepsi.dashboard_reschedule(id bigint, at timestamptz default null) → timestamptz
--   The dashboard's "run now" / "reschedule" button: pepsi.reschedule(id, at),
--   with its refusals (a running message: 55000; a terminal one: 55000 naming
--   requeue; no such message: P0002) passed on for the page to show.
--   Writes: pepsi.workqueue (through pepsi.reschedule).  Locks: the row.
--   Callers: pepsi_dashboard (SECURITY DEFINER: it runs reschedule as the
--   owner; pepsi_dashboard is not granted reschedule itself).
CREATE OR REPLACE FUNCTION pepsi.dashboard_reschedule(id bigint, at timestamptz DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN pepsi.reschedule(dashboard_reschedule.id, dashboard_reschedule.at);
END
$$;
