-- pepsi.dashboard_cancel(ids bigint[]) → int
--   The dashboard's "cancel" button: rows of ids that are 'pending' or
--   'paused' (never running: a worker holds those) become 'failed' with
--   state->>'error' = 'cancelled by operator', timeout cleared.  They can be
--   requeued like any failed row.  An empty or NULL ids cancels nothing.
--   Returns how many rows were cancelled.
--   Writes: pepsi.workqueue.  Locks: the rows cancelled (a row being claimed
--   at that moment is rechecked after the claim commits, and then skipped).
--   Callers: pepsi_dashboard (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.dashboard_cancel(ids bigint[])
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    UPDATE pepsi.workqueue AS w
       SET status = 'failed', timeout = NULL, updated_at = now(),
           state = w.state || '{"error": "cancelled by operator"}'::jsonb
     WHERE w.workqueue_id = ANY (dashboard_cancel.ids)
       AND w.status IN ('pending', 'paused');
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
