-- pepsi.registered_stages()
--   → table(stage text, next text[], max_retries int, retry_delay interval,
--           retry_delay_max interval, parallelism int, queue_limit int,
--           updated_at timestamptz, dispatcher_id bigint)
--   The stage table the dispatcher last registered (pepsi.register_stages),
--   sorted by stage.  Empty until a dispatcher with migration 0009 started.
--   pepsi-queue enqueue checks stage names against it.
--   Reads: pepsi.stages.  Locks: none.
--   Callers: pepsi_dispatcher, pepsi_ingress, pepsi_stage, pepsi_operator (SECURITY DEFINER;
--   pepsi-queue's stage check).
CREATE OR REPLACE FUNCTION pepsi.registered_stages()
RETURNS TABLE (stage text, next text[], max_retries integer, retry_delay interval,
               retry_delay_max interval, parallelism integer, queue_limit integer,
               updated_at timestamptz, dispatcher_id bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT s.stage, s.next, s.max_retries, s.retry_delay, s.retry_delay_max,
           s.parallelism, s.queue_limit, s.updated_at, s.dispatcher_id
      FROM pepsi.stages AS s
     ORDER BY s.stage;
END
$$;
