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
--
-- Why v2 (migration 0006): the row is found by primary key.  v1 re-checked
--   `status = 'running'`, which proves the predicate of the partial index
--   workqueue_running_idx; after an ANALYZE taken while few rows ran, the
--   cached generic plan walked that whole index filtering by id (measured:
--   up to 8 ms per call with a few thousand rows running, the workers'
--   transitions took more time than everything else in a 1-stage bench).
--   `(status = 'running') IS TRUE` is the same test (status is NOT NULL) and
--   proves nothing about the index, so the lookup is by workqueue_pkey.
--
-- Why v3 (migration 0013): a row whose state was near the
--   jsonb size limit made the UPDATE fail (54000) and the row stayed
--   'running' until the next start.  The UPDATE is unchanged and still one
--   statement (one subtransaction per call, none per row).  Only when it
--   fails with program_limit_exceeded: each candidate row's new state is
--   built in a block of its own (the expression only, nothing written), and
--   the UPDATE runs again leaving the state of the rows that failed as it is.
--
-- Why v4 (migration 0023): the plan.  PL/pgSQL caches a statement's plan,
--   but a statement with array parameters was planned again on every call:
--   the plan cache compares the plan made for the call's own arrays with a
--   generic one, and the generic plan's guess at an array's length always
--   priced it higher, so it kept making custom plans.  Planning was about a
--   third of the server's CPU at the shipped stage defaults (perf, a
--   one-stage SDK drain at PARALLELISM 4 x QUEUE_LIMIT 4).  The plan is the
--   same for any arrays (workqueue_pkey for `= ANY(ids)`), so the function
--   now sets plan_cache_mode = force_generic_plan: planned once per session.
--
-- Why v5 (migration 0024): plans that hold however the table grows.  With
--   force_generic_plan the plan is made once per session, at the first call,
--   from the statistics of that moment.  A dispatcher or worker that starts
--   on an empty queue (the usual start) made it for an empty table: a
--   sequential scan, kept for the session's life while the table grew, until
--   an ANALYZE invalidated it (never, where autovacuum is off).  Measured: 850
--   instead of ~150 us of PostgreSQL CPU per message at the shipped stage
--   defaults.  The function now also sets enable_seqscan, enable_hashjoin and
--   enable_mergejoin off, so its plan is index scans and nested loops (the
--   plan v4 gets from fresh statistics) whatever the statistics say.
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
