-- pepsi.dashboard_requeue(ids bigint[]) → int
--   The dashboard's "requeue" button: pepsi.requeue_failed(NULL, ids) -- rows
--   of ids in failed, timeout or expired go back to pending, retries 0, their
--   error kept under state->'previous_error'; when any row moved it notifies
--   channel 'workqueue' (at commit), so the dispatcher claims them at once.
--   An empty or NULL ids moves nothing (never "all", which requeue_failed
--   does for a NULL ids).  Returns how many rows moved.
--   Writes: pepsi.workqueue (through pepsi.requeue_failed).
--   Locks: the rows requeued.
--   Callers: pepsi_dashboard (SECURITY DEFINER: it runs requeue_failed as
--   the owner; pepsi_dashboard is not granted requeue_failed itself).
CREATE OR REPLACE FUNCTION pepsi.dashboard_requeue(ids bigint[])
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    IF coalesce(cardinality(dashboard_requeue.ids), 0) = 0 THEN
        RETURN 0;
    END IF;
    RETURN pepsi.requeue_failed(NULL, dashboard_requeue.ids);
END
$$;
