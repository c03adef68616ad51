-- pepsi.check_answered(dispatcher_id bigint, ids bigint[])
--   → table(workqueue_id bigint, stage text)
--   After a worker answered '0' for ids: any of them still 'running' and
--   held by dispatcher_id (the stage did not write its next state) becomes
--   'failed' with dispatch_error 'stage answered 0 but left the row running'.
--   Returns those rows; normally none.
--   Writes: pepsi.workqueue.  Locks: the rows failed.
--   Guarantees: rows the stage moved, or another dispatcher holds, are untouched.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
--
-- Why v2 (migration 0006): the row is found by primary key.  v1 re-checked
--   `status = 'running'`, which proves the predicate of the partial index
--   workqueue_running_idx; after an ANALYZE taken while few rows ran, the
--   cached generic plan walked that whole index filtering by id (measured:
--   up to 8 ms per call with a few thousand rows running, the workers'
--   transitions took more time than everything else in a 1-stage bench).
--   `(status = 'running') IS TRUE` is the same test (status is NOT NULL) and
--   proves nothing about the index, so the lookup is by workqueue_pkey.
CREATE OR REPLACE FUNCTION pepsi.check_answered(dispatcher_id bigint, ids bigint[])
RETURNS TABLE (workqueue_id bigint, stage text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    UPDATE pepsi.workqueue AS w
       SET status = 'failed', dispatcher_id = NULL, updated_at = now(),
           state = w.state || '{"dispatch_error": "stage answered 0 but left the row running"}'
     WHERE w.workqueue_id = ANY (check_answered.ids)
       AND (w.status = 'running') IS TRUE  -- not the partial index: see header
       AND w.dispatcher_id = check_answered.dispatcher_id
    RETURNING w.workqueue_id, w.stage;
END
$$;
