-- pepsi.queue_counts() → table(stage text, status text, count bigint)
--   Live queue depth: number of rows per (stage, status), sorted.
--   Reads: pepsi.workqueue (a full scan: for operators and metrics scrapes,
--   not for the dispatcher's hot path).  Locks: none.
--   Callers: pepsi_dispatcher, pepsi_operator (SECURITY DEFINER; pepsi-queue).
CREATE OR REPLACE FUNCTION pepsi.queue_counts()
RETURNS TABLE (stage text, status text, count bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT w.stage, w.status, count(*)::bigint
      FROM pepsi.messages AS w
     GROUP BY w.stage, w.status
     ORDER BY w.stage, w.status;
END
$$;
