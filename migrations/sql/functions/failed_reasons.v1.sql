-- pepsi.failed_reasons(in_stage text default null)
--   → table(stage text, status text, reason text, count bigint,
--           oldest timestamptz, newest timestamptz, ids bigint[])
--   Failures grouped by reason (pepsi-queue failed --by-reason): rows in
--   'failed', 'timeout' or 'expired' (of stage in_stage when given), one
--   group per (stage, status, reason) where reason is what failed_messages
--   shows (dispatch_error, else error, else the status); count, the oldest
--   and newest updated_at of the group, and up to 5 of its newest ids.
--   Biggest groups first.
--   Reads: pepsi.workqueue (workqueue_failed_idx).  Locks: none.
--   Callers: pepsi_dispatcher (operators use that role; SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.failed_reasons(in_stage text DEFAULT NULL)
RETURNS TABLE (stage text, status text, reason text, count bigint,
               oldest timestamptz, newest timestamptz, ids bigint[])
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT g.stage, g.status, g.reason, count(*)::bigint, min(g.updated_at),
           max(g.updated_at),
           (array_agg(g.workqueue_id ORDER BY g.workqueue_id DESC))[1:5]
      FROM (SELECT w.stage, w.status, w.workqueue_id, w.updated_at,
                   coalesce(w.state ->> 'dispatch_error', w.state ->> 'error',
                            w.status) AS reason
              FROM pepsi.workqueue AS w
             WHERE w.status IN ('failed', 'timeout', 'expired')
               AND (failed_reasons.in_stage IS NULL OR w.stage = failed_reasons.in_stage)) AS g
     GROUP BY g.stage, g.status, g.reason
     ORDER BY count(*) DESC, g.stage, g.status, g.reason;
END
$$;
