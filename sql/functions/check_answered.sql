-- pepsi.check_answered(dispatcher_id bigint, ids bigint[])
--   → table(workqueue_id bigint, stage text)
--   After a worker answered '0' for ids: any of them still 'running' and
--   held by dispatcher_id (the stage did not write its next state) becomes
--   'failed' with dispatch_error 'stage answered 0 but left the row running'.
--   Returns those rows; normally none.
--   Writes: pepsi.workqueue.  Locks: the rows failed.
--   A row whose state cannot take the note (near the jsonb size limit,
--   255 MB: `state || ...` raises 54000) is failed all the same with its
--   state untouched, and a WARNING names its id and the error.
--   Guarantees: rows the stage moved, or another dispatcher holds, are untouched.
--   Nothing is lost (payload and state stay) and a row this call should fail
--   is never left 'running' because of its state.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.check_answered(dispatcher_id bigint, ids bigint[])
RETURNS TABLE (workqueue_id bigint, stage text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    bare bigint[] := '{}';  -- rows whose state stays as it is
    r record;
    out_ids bigint[];
    out_stages text[];
BEGIN
    FOR pass IN 1..2 LOOP
        BEGIN
            WITH moved AS (
                UPDATE pepsi.workqueue AS w
                   SET status = 'failed', dispatcher_id = NULL, updated_at = now(),
                       state = CASE WHEN w.workqueue_id = ANY (bare) THEN w.state
                                    ELSE w.state || '{"dispatch_error": "stage answered 0 but left the row running"}'
                               END
                 WHERE w.workqueue_id = ANY (check_answered.ids)
                   AND (w.status = 'running') IS TRUE  -- not the partial index: see header
                   AND w.dispatcher_id = check_answered.dispatcher_id
                RETURNING w.workqueue_id, w.stage
            )
            SELECT array_agg(m.workqueue_id), array_agg(m.stage)
              INTO out_ids, out_stages
              FROM moved AS m;
            EXIT;
        EXCEPTION WHEN program_limit_exceeded THEN
            IF pass > 1 THEN
                RAISE;
            END IF;
        END;
        FOR r IN
            SELECT w.workqueue_id AS id, w.state
              FROM pepsi.workqueue AS w
             WHERE w.workqueue_id = ANY (check_answered.ids)
               AND (w.status = 'running') IS TRUE
               AND w.dispatcher_id = check_answered.dispatcher_id
        LOOP
            BEGIN
                PERFORM r.state || '{"dispatch_error": "stage answered 0 but left the row running"}'::jsonb;
            EXCEPTION WHEN OTHERS THEN
                bare := bare || r.id;
                RAISE WARNING 'check_answered: row % is failed without a dispatch_error (%: %)',
                    r.id, SQLSTATE, SQLERRM;
            END;
        END LOOP;
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(out_ids, out_stages);
END
$$;
