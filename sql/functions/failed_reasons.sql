-- pepsi.failed_reasons(in_stage text default null)
--   → table(stage text, status text, reason text, count bigint,
--           oldest timestamptz, newest timestamptz, ids bigint[],
--           examples text[])
--   Failures grouped by cause (pepsi-queue failed --by-reason, the
--   dashboard's failures): rows in 'failed', 'timeout' or 'expired' (of
--   stage in_stage when given), one group per (stage, status, reason) where
--   reason is pepsi._normalise_reason of what failed_messages shows
--   (dispatch_error, else error, else the status): "bad input n=201" and
--   "bad input n=202" are one group "bad input n=<n>".  count, the oldest
--   and newest updated_at of the group, up to 5 of its newest ids, and up to
--   3 of its distinct raw reasons (examples, newest first).  The raw reason
--   of every member: failed_messages(stage, max_rows, reason).
--   Biggest groups first.
--   Reads: pepsi.workqueue (workqueue_failed_idx).  Locks: none.
--   Callers: pepsi_dispatcher, pepsi_operator, pepsi_dashboard (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.failed_reasons(in_stage text DEFAULT NULL)
RETURNS TABLE (stage text, status text, reason text, count bigint,
               oldest timestamptz, newest timestamptz, ids bigint[], examples text[])
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT g.stage, g.status, g.pattern, count(*)::bigint, min(g.updated_at),
           max(g.updated_at),
           (array_agg(g.workqueue_id ORDER BY g.workqueue_id DESC))[1:5],
           (SELECT array_agg(e.raw) FROM (
                SELECT x.raw FROM unnest(array_agg(g.raw ORDER BY g.workqueue_id DESC))
                       WITH ORDINALITY AS x(raw, n)
                 GROUP BY x.raw ORDER BY min(x.n) LIMIT 3) AS e)
      FROM (SELECT w.stage, w.status, w.workqueue_id, w.updated_at, r.raw,
                   pepsi._normalise_reason(r.raw) AS pattern
              FROM pepsi.messages AS w
             CROSS JOIN LATERAL (SELECT coalesce(w.state ->> 'dispatch_error',
                                                 w.state ->> 'error', w.status) AS raw) AS r
             WHERE w.status IN ('failed', 'timeout', 'expired')
               AND (failed_reasons.in_stage IS NULL OR w.stage = failed_reasons.in_stage)) AS g
     GROUP BY g.stage, g.status, g.pattern
     ORDER BY count(*) DESC, g.stage, g.status, g.pattern;
END
$$;
