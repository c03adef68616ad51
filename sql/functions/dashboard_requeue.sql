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
--
-- Why v2 (migration 0012): v1 sent its own NOTIFY after requeue_failed,
--   which has notified by itself since v2 (migration 0009).  PostgreSQL folds
--   the identical second notification into the first, so nothing changes on
--   the wire; the rule "requeue notifies" now lives in one place.
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
