-- pepsi.hop(id bigint, from_stage text, to_stage text,
--           dispatcher_id bigint default null) → boolean
--   Stage fusion: a worker that runs the successor to_stage in the same pass
--   moves its running message there first: stage := to_stage, retries 0, the
--   row stays 'running' and held by the same dispatcher.  The pass then ends
--   with an ordinary transition from to_stage (so a pause retries at the fused
--   stage and a failure is recorded there).  Applies only when the row is
--   'running' at from_stage (and held by dispatcher_id when given); otherwise
--   changes nothing and returns false.  The SDK checks the stage graph
--   (to_stage in NEXT of from_stage) before calling it.
--   Raises 22023 for a NULL or malformed to_stage.
--   Writes: pepsi.workqueue (one row).  Locks: that row.
--   Callers: pepsi_stage (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.hop(id bigint, from_stage text, to_stage text,
                                     dispatcher_id bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pepsi._check_stage(hop.to_stage);
    UPDATE pepsi.workqueue AS w
       SET stage = hop.to_stage, retries = 0, updated_at = now()
     WHERE w.workqueue_id = hop.id
       AND w.stage = hop.from_stage
       AND (w.status = 'running') IS TRUE  -- not the partial index: see header
       AND (hop.dispatcher_id IS NULL OR w.dispatcher_id = hop.dispatcher_id);
    RETURN FOUND;
END
$$;
