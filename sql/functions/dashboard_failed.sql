-- pepsi.dashboard_failed(reason text default null, in_stage text default null,
--                        max_rows int default 200)
--   → table(workqueue_id bigint, stage text, status text, retries int,
--           error text, created_at timestamptz, updated_at timestamptz)
--   The messages behind one row of dashboard_snapshot's failure_reasons:
--   rows in 'failed', 'timeout' or 'expired' whose reason (dispatch_error,
--   else error, else the status) equals reason (any when NULL), of stage
--   in_stage when given; newest first, at most max_rows.
--   Reads: pepsi.workqueue (workqueue_failed_idx).  Writes: nothing.
--   Locks: none.
--   Callers: pepsi_dashboard (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.dashboard_failed(reason text DEFAULT NULL,
                                                  in_stage text DEFAULT NULL,
                                                  max_rows integer DEFAULT 200)
RETURNS TABLE (workqueue_id bigint, stage text, status text, retries integer,
               error text, created_at timestamptz, updated_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT w.workqueue_id, w.stage, w.status, w.retries, r.reason, w.created_at, w.updated_at
      FROM pepsi.messages AS w
     CROSS JOIN LATERAL (SELECT coalesce(w.state ->> 'dispatch_error', w.state ->> 'error',
                                         w.status) AS reason) AS r
     WHERE w.status IN ('failed', 'timeout', 'expired')
       AND (dashboard_failed.in_stage IS NULL OR w.stage = dashboard_failed.in_stage)
       AND (dashboard_failed.reason IS NULL OR r.reason = dashboard_failed.reason)
     ORDER BY w.workqueue_id DESC
     LIMIT greatest(coalesce(dashboard_failed.max_rows, 200), 0);
END
$$;
