-- pepsi.enqueue(stage text, payload jsonb default '{}') → bigint
--   Inserts one pending message for stage and returns its workqueue_id.
--   A NULL payload is stored as '{}'.
--   Raises 22023 for a NULL or malformed stage name.
--   Writes: pepsi.workqueue (one INSERT → one NOTIFY 'workqueue').
--   Locks: none beyond the insert.
--   Callers: pepsi_ingress, pepsi_stage (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.enqueue(stage text, payload jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    new_id bigint;
BEGIN
    PERFORM pepsi._check_stage(enqueue.stage);
    INSERT INTO pepsi.workqueue AS w (stage, payload)
    VALUES (enqueue.stage, coalesce(enqueue.payload, '{}'))
    RETURNING w.workqueue_id INTO new_id;
    RETURN new_id;
END
$$;
