-- pepsi.dashboard_cancel(ids bigint[]) → int
--   The dashboard's "cancel" button: pepsi.cancel(ids) -- rows of ids that
--   are 'pending' or 'paused' (delayed ones included; never running: a worker
--   holds those) become 'failed' with state->>'error' = 'cancelled by
--   operator', exactly as pepsi-queue cancel does (see cancel.sql).  They
--   can be requeued like any failed row.  An empty or NULL ids cancels
--   nothing (never "all"; pepsi.cancel would refuse a NULL selection).
--   Returns how many rows were cancelled.
--   Writes: pepsi.workqueue (through pepsi.cancel).  Locks: the rows
--   cancelled (a row being claimed at that moment is rechecked after the
--   claim commits, and then skipped).
--   Callers: pepsi_dashboard (SECURITY DEFINER: it runs pepsi.cancel as the
--   owner; pepsi_dashboard is not granted pepsi.cancel itself).
CREATE OR REPLACE FUNCTION pepsi.dashboard_cancel(ids bigint[])
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    IF coalesce(cardinality(dashboard_cancel.ids), 0) = 0 THEN
        RETURN 0;
    END IF;
    RETURN pepsi.cancel(ids => dashboard_cancel.ids);
END
$$;
