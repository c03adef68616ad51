-- pepsi.failed_messages(in_stage text default null, max_rows int default 100)
--   → table(workqueue_id bigint, stage text, status text, retries int,
--           error text, updated_at timestamptz, payload jsonb)
--   Operator view of what went wrong: rows in 'failed', 'timeout' or
--   'expired' (of stage in_stage when given), newest first, at most max_rows.
--   error is state->>'dispatch_error' when the dispatcher wrote one, else
--   state->>'error' (the stage's reason), else the status.
--   Reads: pepsi.workqueue (workqueue_failed_idx).  Locks: none.
--   Callers: pepsi_dispatcher (operators use that role; SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.failed_messages(in_stage text DEFAULT NULL,
                                                 max_rows integer DEFAULT 100)
RETURNS TABLE (workqueue_id bigint, stage text, status text, retries integer,
               error text, updated_at timestamptz, payload jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT w.workqueue_id, w.stage, w.status, w.retries,
           coalesce(w.state ->> 'dispatch_error', w.state ->> 'error', w.status),
           w.updated_at, w.payload
      FROM pepsi.workqueue AS w
     WHERE w.status IN ('failed', 'timeout', 'expired')
       AND (failed_messages.in_stage IS NULL OR w.stage = failed_messages.in_stage)
     ORDER BY w.workqueue_id DESC
     LIMIT greatest(coalesce(failed_messages.max_rows, 100), 0);
END
$$;
