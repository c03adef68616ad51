-- pepsi.fail(id bigint, from_stage text, reason text,
--            dispatcher_id bigint default null) → boolean
--   Marks a running message 'failed' with reason in state->>'error'
--   (a NULL reason is stored as 'failed without a reason').  Applies only
--   when the row is 'running' at from_stage (and held by dispatcher_id when
--   given); otherwise changes nothing and returns false.
--   Writes: pepsi.workqueue (one row).  Locks: that row.
--   Callers: pepsi_stage (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.fail(id bigint, from_stage text, reason text,
                                      dispatcher_id bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE pepsi.workqueue AS w
       SET status = 'failed', timeout = NULL, dispatcher_id = NULL, updated_at = now(),
           state = w.state || jsonb_build_object(
                       'error', coalesce(fail.reason, 'failed without a reason'))
     WHERE w.workqueue_id = fail.id
       AND w.stage = fail.from_stage
       AND (w.status = 'running') IS TRUE  -- not the partial index: see header
       AND (fail.dispatcher_id IS NULL OR w.dispatcher_id = fail.dispatcher_id);
    RETURN FOUND;
END
$$;
