-- pepsi.purge(statuses text[], stage text default null,
--             older_than interval default null) → bigint
--   Operator action: deletes rows in the given terminal statuses ('done',
--   'failed', 'timeout', 'expired'; anything else raises 22023), of that
--   stage when given, last updated longer than older_than ago when given.
--   Pending, running and paused rows are never deleted.  Returns the count.
--   Writes: pepsi.workqueue.  Locks: the rows deleted.
--   Callers: pepsi_dispatcher (operators use that role; SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.purge(statuses text[], stage text DEFAULT NULL,
                                       older_than interval DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    n bigint;
BEGIN
    IF purge.statuses IS NULL OR cardinality(purge.statuses) = 0
       OR NOT purge.statuses <@ ARRAY['done', 'failed', 'timeout', 'expired'] THEN
        RAISE EXCEPTION 'purge deletes only terminal rows: statuses must be among done, failed, timeout, expired (got %)',
                        coalesce(purge.statuses::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    DELETE FROM pepsi.workqueue AS w
     WHERE w.status = ANY (purge.statuses)
       AND (purge.stage IS NULL OR w.stage = purge.stage)
       AND (purge.older_than IS NULL OR w.updated_at < now() - purge.older_than);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
