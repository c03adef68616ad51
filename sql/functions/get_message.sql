-- pepsi.get_message(id bigint)
--   → table(workqueue_id bigint, stage text, status text, payload jsonb, state jsonb, retries int)
--   Reads one message for a worker (no row if the id does not exist).
--   Reads: pepsi.workqueue (primary key).  Locks: none.
--   Callers: pepsi_stage, pepsi_dispatcher, pepsi_operator (SECURITY DEFINER: stage programs
--   have no SELECT on the table).
CREATE OR REPLACE FUNCTION pepsi.get_message(id bigint)
RETURNS TABLE (workqueue_id bigint, stage text, status text, payload jsonb,
               state jsonb, retries integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT w.workqueue_id, w.stage, w.status, w.payload, w.state, w.retries
      FROM pepsi.messages AS w
     WHERE w.workqueue_id = get_message.id;
END
$$;
