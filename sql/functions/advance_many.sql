-- pepsi.advance_many(ids bigint[], from_stage text, to_stage text,
--                    dispatcher_id bigint default null) → setof bigint
--   pepsi.advance for a batch, in one statement: every row of ids that is
--   'running' at from_stage (and held by dispatcher_id when given) moves to
--   to_stage: status 'pending', retries 0, timeout and dispatcher_id
--   cleared; returns the ids it changed.  An id it did not change (not
--   running there, another holder, no such row) is left alone, as
--   pepsi.advance returning false would.  An empty or NULL ids, or a NULL
--   from_stage, changes nothing.
--   Raises 22023 for a NULL or malformed to_stage (pepsi._check_stage, as
--   advance), before looking at any row: also when ids is empty or none
--   applies.
--   Writes: pepsi.workqueue (the rows advanced).  Locks: those rows, in
--   primary-key order (as finish_many: the order of the plan, an index scan
--   of workqueue_pkey visiting `= ANY(ids)` in ascending id order).
--   Callers: pepsi_stage (SECURITY DEFINER), batch workers and the SDK's
--   group commit (advances of one stage to one stage).
CREATE OR REPLACE FUNCTION pepsi.advance_many(ids bigint[], from_stage text, to_stage text,
                                              dispatcher_id bigint DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
BEGIN
    PERFORM pepsi._check_stage(advance_many.to_stage);
    RETURN QUERY
    UPDATE pepsi.workqueue AS w
       SET stage = advance_many.to_stage, status = 'pending', retries = 0,
           timeout = NULL, dispatcher_id = NULL, updated_at = now()
     WHERE w.workqueue_id = ANY (advance_many.ids)
       AND w.stage = advance_many.from_stage
       AND (w.status = 'running') IS TRUE  -- not the partial index: see header
       AND (advance_many.dispatcher_id IS NULL OR w.dispatcher_id = advance_many.dispatcher_id)
    RETURNING w.workqueue_id;
END
$$;
