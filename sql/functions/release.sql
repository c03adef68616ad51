-- pepsi.release(dispatcher_id bigint, ids bigint[] default null) → int
--   Claimed-but-unstarted rows back to the queue: running rows held by
--   dispatcher_id (only those in ids; all of them when ids is NULL) become
--   'pending' with dispatcher_id cleared, retries unchanged.  Returns how
--   many moved.  Rows the stage already moved are untouched.
--   Writes: pepsi.workqueue.  Reads: workqueue_running_idx.
--   Locks: the rows released.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.release(dispatcher_id bigint, ids bigint[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    UPDATE pepsi.workqueue AS w
       SET status = 'pending', dispatcher_id = NULL, updated_at = now()
     WHERE w.status = 'running'
       AND w.dispatcher_id = release.dispatcher_id
       AND (release.ids IS NULL OR w.workqueue_id = ANY (release.ids));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
