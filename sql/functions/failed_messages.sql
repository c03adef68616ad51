-- pepsi.failed_messages(in_stage text default null, max_rows int default 100,
--                       in_reason text default null)
--   → table(workqueue_id bigint, stage text, status text, retries int,
--           error text, updated_at timestamptz, payload jsonb, reason text)
--   Operator view of what went wrong: rows in 'failed', 'timeout' or
--   'expired' (of stage in_stage when given; of the failure group in_reason
--   when given, a normalised reason as failed_reasons shows it), newest
--   first, at most max_rows.  error is the raw reason: state->>'dispatch_error'
--   when the dispatcher wrote one, else state->>'error' (the stage's
--   reason), else the status; reason is its group (pepsi._normalise_reason).
--   Reads: pepsi.workqueue (workqueue_failed_idx).  Locks: none.
--   Callers: pepsi_dispatcher, pepsi_operator, pepsi_dashboard (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.failed_messages(in_stage text DEFAULT NULL,
                                                 max_rows integer DEFAULT 100,
                                                 in_reason text DEFAULT NULL)
RETURNS TABLE (workqueue_id bigint, stage text, status text, retries integer,
               error text, updated_at timestamptz, payload jsonb, reason text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT f.workqueue_id, f.stage, f.status, f.retries, f.raw, f.updated_at, f.payload,
           pepsi._normalise_reason(f.raw)
      FROM (SELECT w.workqueue_id, w.stage, w.status, w.retries, w.updated_at, w.payload,
                   coalesce(w.state ->> 'dispatch_error', w.state ->> 'error', w.status) AS raw
              FROM pepsi.messages AS w
             WHERE w.status IN ('failed', 'timeout', 'expired')
               AND (failed_messages.in_stage IS NULL OR w.stage = failed_messages.in_stage)) AS f
     WHERE failed_messages.in_reason IS NULL
        OR pepsi._normalise_reason(f.raw) = failed_messages.in_reason
     ORDER BY f.workqueue_id DESC
     LIMIT greatest(coalesce(failed_messages.max_rows, 100), 0);
END
$$;
