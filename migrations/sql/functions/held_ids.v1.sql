-- pepsi.held_ids(dispatcher_id bigint) → table(workqueue_id bigint)
--   The running rows the database says dispatcher_id holds, sorted by id.
--   After a reconnect the dispatcher compares them with its workers: a claim
--   that committed while its answer was lost with the connection left rows
--   that no worker has, and they are released.  NULL id: no rows.
--   Reads: pepsi.workqueue (workqueue_running_idx: its predicate is the
--   query's own, so the plan walks that index whatever the statistics say).
--   Locks: none.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.held_ids(dispatcher_id bigint)
RETURNS TABLE (workqueue_id bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT w.workqueue_id
      FROM pepsi.workqueue AS w
     WHERE w.status = 'running'
       AND w.dispatcher_id = held_ids.dispatcher_id
     ORDER BY w.workqueue_id;
END
$$;
