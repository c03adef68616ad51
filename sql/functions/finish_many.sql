-- pepsi.finish_many(ids bigint[], from_stage text, dispatcher_id bigint default null)
--   → setof bigint
--   pepsi.finish for a batch, in one statement: every row of ids that is
--   'running' at from_stage (and held by dispatcher_id when given) becomes
--   'done'; returns the ids it changed.  An id it did not change (not running
--   there, another holder, no such row) is left alone, as pepsi.finish
--   returning false would.
--   Writes: pepsi.workqueue (the rows finished).  Locks: those rows, in
--   primary-key order.
--   Callers: pepsi_stage (SECURITY DEFINER), batch workers and the SDK's
--   group commit (finishes of one stage, when the database has it).
CREATE OR REPLACE FUNCTION pepsi.finish_many(ids bigint[], from_stage text,
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
    RETURN QUERY
    UPDATE pepsi.workqueue AS w
       SET status = 'done', timeout = NULL, dispatcher_id = NULL, updated_at = now()
     WHERE w.workqueue_id = ANY (finish_many.ids)
       AND w.stage = finish_many.from_stage
       AND (w.status = 'running') IS TRUE  -- not the partial index: see header
       AND (finish_many.dispatcher_id IS NULL OR w.dispatcher_id = finish_many.dispatcher_id)
    RETURNING w.workqueue_id;
END
$$;
