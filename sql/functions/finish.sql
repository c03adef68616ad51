-- pepsi.finish(id bigint, from_stage text, dispatcher_id bigint default null) → boolean
--   Marks a running message 'done' (final stage finished).  Applies only when
--   the row is 'running' at from_stage (and held by dispatcher_id when
--   given); otherwise changes nothing and returns false.
--   Writes: pepsi.workqueue (one row).  Locks: that row.
--   Callers: pepsi_stage (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.finish(id bigint, from_stage text,
                                        dispatcher_id bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE pepsi.workqueue AS w
       SET status = 'done', timeout = NULL, dispatcher_id = NULL, updated_at = now()
     WHERE w.workqueue_id = finish.id
       AND w.stage = finish.from_stage
       AND (w.status = 'running') IS TRUE  -- not the partial index: see header
       AND (finish.dispatcher_id IS NULL OR w.dispatcher_id = finish.dispatcher_id);
    RETURN FOUND;
END
$$;
