-- pepsi.advance(id bigint, from_stage text, to_stage text,
--               dispatcher_id bigint default null) → boolean
--   Hands a running message to its next stage: stage := to_stage,
--   status 'pending', retries 0, timeout and dispatcher_id cleared, in one
--   UPDATE.  Applies only when the row is 'running' at from_stage (and held
--   by dispatcher_id when that fencing token is given); otherwise changes
--   nothing and returns false.
--   Raises 22023 for a NULL or malformed to_stage.
--   Writes: pepsi.workqueue (one row).  Locks: that row.
--   Callers: pepsi_stage (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.advance(id bigint, from_stage text, to_stage text,
                                         dispatcher_id bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pepsi._check_stage(advance.to_stage);
    UPDATE pepsi.workqueue AS w
       SET stage = advance.to_stage, status = 'pending', retries = 0,
           timeout = NULL, dispatcher_id = NULL, updated_at = now()
     WHERE w.workqueue_id = advance.id
       AND w.stage = advance.from_stage
       AND (w.status = 'running') IS TRUE  -- not the partial index: see header
       AND (advance.dispatcher_id IS NULL OR w.dispatcher_id = advance.dispatcher_id);
    RETURN FOUND;
END
$$;
