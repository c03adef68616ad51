-- pepsi.dashboard_requeue(ids bigint[]) → int
--   The dashboard's "requeue" button: pepsi.requeue_failed(NULL, ids) (rows
--   of ids in failed, timeout or expired go back to pending, retries 0, their
--   error kept under state->'previous_error'), then one NOTIFY on channel
--   'workqueue' when any row moved, so the dispatcher claims them at once
--   instead of at its next heartbeat.  An empty or NULL ids moves nothing
--   (never "all").  Returns how many rows moved.
--   Writes: pepsi.workqueue.  Locks: the rows requeued.
--   Callers: pepsi_dashboard (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.dashboard_requeue(ids bigint[])
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    IF coalesce(cardinality(dashboard_requeue.ids), 0) = 0 THEN
        RETURN 0;
    END IF;
    n := pepsi.requeue_failed(NULL, dashboard_requeue.ids);
    IF n > 0 THEN
        PERFORM pg_notify('workqueue', '');
    END IF;
    RETURN n;
END
$$;
