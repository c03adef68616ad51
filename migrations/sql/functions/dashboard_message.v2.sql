-- pepsi.dashboard_message(id bigint) → jsonb
--   One message for the dashboard's message page: every column of its
--   pepsi.workqueue row (timestamps as ISO text), plus age_seconds (since
--   created_at) and idle_seconds (since updated_at).  NULL when no such row.
--   Reads: pepsi.workqueue (primary key).  Writes: nothing.  Locks: none.
--   Callers: pepsi_dashboard (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.dashboard_message(id bigint)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT to_jsonb(w) || jsonb_build_object(
                       'age_seconds', extract(epoch FROM now() - w.created_at),
                       'idle_seconds', extract(epoch FROM now() - w.updated_at))
              FROM pepsi.messages AS w
             WHERE w.workqueue_id = dashboard_message.id);
END
$$;
