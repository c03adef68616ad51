-- pepsi.enqueue_many(stage text, payloads jsonb[], not_before timestamptz default null)
--   → setof bigint
--   Inserts one message per element of payloads, in array order, in ONE
--   statement (so one NOTIFY 'workqueue'); returns the new ids in the same
--   order.  NULL elements are stored as '{}'.  An empty or NULL array inserts
--   nothing and notifies nobody.  not_before as in pepsi.enqueue: in the
--   future, every row waits as a delayed 'paused' row until then
--   (state->>'delayed_until' marks it).
--   Raises 22023 for a NULL or malformed stage name or when any payload is
--   not a JSON object (naming the first such element; nothing is inserted),
--   22008 for a non-finite not_before.
--   Writes: pepsi.workqueue (delayed rows: also NOTIFY 'workqueue', 'delayed',
--   as enqueue).  Locks: none beyond the insert.
--   Callers: pepsi_ingress, pepsi_stage (SECURITY DEFINER).
--
-- Why v2 (migration 0009): not_before and object-only payloads, as enqueue
--   v2.  The 2-argument v1 is dropped (2-argument calls resolve to v2).
CREATE OR REPLACE FUNCTION pepsi.enqueue_many(stage text, payloads jsonb[],
                                              not_before timestamptz DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    later boolean := enqueue_many.not_before IS NOT NULL AND enqueue_many.not_before > now();
    bad record;
BEGIN
    PERFORM pepsi._check_stage(enqueue_many.stage);
    IF NOT isfinite(enqueue_many.not_before) THEN
        RAISE EXCEPTION 'not_before must be a finite time (got %)', enqueue_many.not_before
            USING ERRCODE = '22008';
    END IF;
    IF coalesce(cardinality(enqueue_many.payloads), 0) = 0 THEN
        RETURN;
    END IF;
    SELECT u.p, u.n INTO bad
      FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS u(p, n)
     WHERE u.p IS NOT NULL AND jsonb_typeof(u.p) <> 'object'
     ORDER BY u.n
     LIMIT 1;
    IF FOUND THEN
        PERFORM pepsi._check_payload(bad.p, format('payload %s of %s', bad.n,
                                                   cardinality(enqueue_many.payloads)));
    END IF;
    IF later THEN
        PERFORM pg_notify('workqueue', 'delayed');  -- as enqueue: learn the due time
    END IF;
    RETURN QUERY
    INSERT INTO pepsi.workqueue AS w (stage, payload, status, timeout, state)
    SELECT enqueue_many.stage, coalesce(u.p, '{}'),
           CASE WHEN later THEN 'paused' ELSE 'pending' END,
           CASE WHEN later THEN enqueue_many.not_before END,
           CASE WHEN later THEN jsonb_build_object('delayed_until', enqueue_many.not_before)
                ELSE '{}' END
      FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS u(p, n)
     ORDER BY u.n
    RETURNING w.workqueue_id;
END
$$;
