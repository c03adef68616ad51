-- pepsi.get_messages(ids bigint[])
--   → table(workqueue_id bigint, stage text, status text, payload jsonb, state jsonb, retries int)
--   Reads many messages in one round trip, in the order of ids (ids that do
--   not exist are skipped; a repeated id comes back repeated).
--   Reads: pepsi.workqueue (primary key).  Locks: none.
--   Callers: pepsi_stage, pepsi_dispatcher (SECURITY DEFINER).
--
-- Why v2 (migration 0023): the plan.  PL/pgSQL caches a statement's plan,
--   but a statement with array parameters was planned again on every call:
--   the plan cache compares the plan made for the call's own arrays with a
--   generic one, and the generic plan's guess at an array's length always
--   priced it higher, so it kept making custom plans.  Planning was about a
--   third of the server's CPU at the shipped stage defaults (perf, a
--   one-stage SDK drain at PARALLELISM 4 x QUEUE_LIMIT 4).  The plan is the
--   same for any arrays (a nested loop over workqueue_pkey), so the function
--   now sets plan_cache_mode = force_generic_plan: planned once per session.
CREATE OR REPLACE FUNCTION pepsi.get_messages(ids bigint[])
RETURNS TABLE (workqueue_id bigint, stage text, status text, payload jsonb,
               state jsonb, retries integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    SELECT w.workqueue_id, w.stage, w.status, w.payload, w.state, w.retries
      FROM unnest(get_messages.ids) WITH ORDINALITY AS u(id, n)
      JOIN pepsi.workqueue AS w ON w.workqueue_id = u.id
     ORDER BY u.n;
END
$$;
