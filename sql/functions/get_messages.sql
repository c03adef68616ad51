-- pepsi.get_messages(ids bigint[])
--   → table(workqueue_id bigint, stage text, status text, payload jsonb, state jsonb, retries int)
--   Reads many messages in one round trip, in the order of ids (ids that do
--   not exist are skipped; a repeated id comes back repeated).
--   Reads: pepsi.workqueue (primary key).  Locks: none.
--   Callers: pepsi_stage, pepsi_dispatcher, pepsi_operator (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.get_messages(ids bigint[])
RETURNS TABLE (workqueue_id bigint, stage text, status text, payload jsonb,
               state jsonb, retries integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
BEGIN
    RETURN QUERY
    SELECT w.workqueue_id, w.stage, w.status, w.payload, w.state, w.retries
      FROM unnest(get_messages.ids) WITH ORDINALITY AS u(id, n)
      JOIN pepsi.workqueue AS w ON w.workqueue_id = u.id
     ORDER BY u.n;
END
$$;
