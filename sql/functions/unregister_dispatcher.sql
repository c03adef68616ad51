-- pepsi.unregister_dispatcher(dispatcher_id bigint) → void
--   Removes the dispatcher from the registry.  Any row it still holds
--   (normally none: shutdown releases them first) goes back to pending, so
--   no row is left running without a live holder.
--   Writes: pepsi.workqueue (its running rows), pepsi.dispatchers (one DELETE).
--   Locks: those rows.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.unregister_dispatcher(dispatcher_id bigint)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE pepsi.workqueue AS w
       SET status = 'pending', dispatcher_id = NULL, updated_at = now()
     WHERE w.status = 'running'
       AND w.dispatcher_id = unregister_dispatcher.dispatcher_id;
    DELETE FROM pepsi.dispatchers AS d
     WHERE d.dispatcher_id = unregister_dispatcher.dispatcher_id;
END
$$;
