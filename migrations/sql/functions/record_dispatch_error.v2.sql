-- pepsi.record_dispatch_error(dispatcher_id bigint, ids bigint[], statuses text[],
--                             errors text[]) → int
--   For each i: if row ids[i] is still 'running' and held by dispatcher_id,
--   status := statuses[i] ('failed' or 'timeout'), state.dispatch_error :=
--   errors[i], dispatcher_id cleared.  Returns how many rows changed.
--   Raises 22023 when the arrays differ in length or a status is not
--   'failed'/'timeout'.
--   Writes: pepsi.workqueue.  Locks: the rows changed.
--   Guarantees: a row the stage already moved (advanced, finished, paused,
--   failed) or another dispatcher holds is never touched.
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
CREATE OR REPLACE FUNCTION pepsi.record_dispatch_error(dispatcher_id bigint, ids bigint[],
                                                       statuses text[], errors text[])
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(statuses)
       OR cardinality(ids) IS DISTINCT FROM cardinality(errors) THEN
        RAISE EXCEPTION 'ids, statuses and errors differ in length'
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(statuses) AS s(st)
                WHERE s.st IS NULL OR s.st NOT IN ('failed', 'timeout')) THEN
        RAISE EXCEPTION 'dispatch error status must be failed or timeout'
            USING ERRCODE = '22023';
    END IF;
    UPDATE pepsi.workqueue AS w
       SET status = u.st, dispatcher_id = NULL, timeout = NULL, updated_at = now(),
           state = w.state || jsonb_build_object('dispatch_error',
                                                 coalesce(u.err, 'dispatch error'))
      FROM unnest(record_dispatch_error.ids, record_dispatch_error.statuses,
                  record_dispatch_error.errors) AS u(id, st, err)
     WHERE w.workqueue_id = u.id
       AND (w.status = 'running') IS TRUE  -- not the partial index: see header
       AND w.dispatcher_id = record_dispatch_error.dispatcher_id;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
