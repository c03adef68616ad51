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
       AND w.status = 'running'
       AND w.dispatcher_id = record_dispatch_error.dispatcher_id;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
