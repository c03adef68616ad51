-- pepsi.stages_of(ids bigint[]) → table(workqueue_id bigint, stage text)
--   The current stage of each existing row of ids, whatever its status,
--   sorted by id; ids that do not exist are left out, a repeated id comes
--   back once.  Only the stage: no payload or state (get_messages returns
--   those, which can be large).  The dispatcher asks it after a reconnect,
--   for rows it owes an answer check, to tell a row its stage advanced (and
--   a lost claim took again) from one left running.  NULL ids: no rows.
--   Reads: pepsi.workqueue (primary key).  Locks: none.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.stages_of(ids bigint[])
RETURNS TABLE (workqueue_id bigint, stage text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT w.workqueue_id, w.stage
      FROM pepsi.workqueue AS w
     WHERE w.workqueue_id = ANY (stages_of.ids)
     ORDER BY w.workqueue_id;
END
$$;
