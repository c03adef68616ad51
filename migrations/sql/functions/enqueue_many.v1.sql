-- pepsi.enqueue_many(stage text, payloads jsonb[]) → setof bigint
--   Inserts one pending message per element of payloads, in array order, in
--   ONE statement (so one NOTIFY 'workqueue'); returns the new ids in the
--   same order.  NULL elements are stored as '{}'.  An empty or NULL array
--   inserts nothing and notifies nobody.
--   Raises 22023 for a NULL or malformed stage name.
--   Writes: pepsi.workqueue.  Locks: none beyond the insert.
--   Callers: pepsi_ingress, pepsi_stage (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.enqueue_many(stage text, payloads jsonb[])
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pepsi._check_stage(enqueue_many.stage);
    IF coalesce(cardinality(enqueue_many.payloads), 0) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    INSERT INTO pepsi.workqueue AS w (stage, payload)
    SELECT enqueue_many.stage, coalesce(u.p, '{}')
      FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS u(p, n)
     ORDER BY u.n
    RETURNING w.workqueue_id;
END
$$;
