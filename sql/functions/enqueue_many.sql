-- pepsi.enqueue_many(stage text, payloads jsonb[], not_before timestamptz default null,
--                    priority integer default 0, dedupe_keys text[] default null)
--   → setof bigint
--   One message per element of payloads, in array order; returns one id per
--   element in the same order.  NULL elements are stored as '{}'.  An empty
--   or NULL array inserts nothing and notifies nobody.  not_before and
--   priority as in pepsi.enqueue, for every row of the call.
--   dedupe_keys: NULL, or aligned with payloads (a NULL element: that
--   message has no key).  A key that a pending, running or paused message
--   already carries inserts nothing for that element and returns that
--   message's id; an element whose key an earlier element of the same call
--   took returns the earlier element's id.  Concurrent callers with the
--   same key get the same id, as with pepsi.enqueue.
--   Without keys the rows are inserted by ONE statement (one NOTIFY
--   'workqueue'), as before; with keys by one INSERT ... ON CONFLICT DO
--   NOTHING (again once more only for a key whose holder became terminal
--   meanwhile).  Ids of one call ascend in array order among the rows it
--   inserted.
--   Raises 22023 for a NULL or malformed stage name, when any payload is not
--   a JSON object (naming the first such element; nothing is inserted), when
--   dedupe_keys and payloads differ in length, or for a key empty, only whitespace or
--   longer than 512 bytes; 22008 for a non-finite not_before.
--   Writes: pepsi.workqueue (delayed rows: also NOTIFY 'workqueue', 'delayed',
--   as enqueue).  Locks: none beyond the insert and the keys' index entries.
--   Callers: pepsi_ingress, pepsi_stage, pepsi_operator (SECURITY DEFINER; pepsi-queue
--   enqueue).
CREATE OR REPLACE FUNCTION pepsi.enqueue_many(stage text, payloads jsonb[],
                                              not_before timestamptz DEFAULT NULL,
                                              priority integer DEFAULT 0,
                                              dedupe_keys text[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    later boolean := enqueue_many.not_before IS NOT NULL AND enqueue_many.not_before > now();
    bad record;
    ids bigint[];
    missing integer;
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
    IF enqueue_many.dedupe_keys IS NOT NULL THEN
        IF cardinality(enqueue_many.dedupe_keys) <> cardinality(enqueue_many.payloads) THEN
            RAISE EXCEPTION 'dedupe_keys and payloads differ in length (% vs %)',
                            cardinality(enqueue_many.dedupe_keys),
                            cardinality(enqueue_many.payloads)
                USING ERRCODE = '22023';
        END IF;
        IF EXISTS (SELECT FROM unnest(enqueue_many.dedupe_keys) AS k
                    WHERE k !~ '\S' OR octet_length(k) > 512) THEN
            RAISE EXCEPTION 'every dedupe_key must be 1 to 512 bytes long and not only whitespace'
                USING ERRCODE = '22023';
        END IF;
    END IF;
    IF later THEN
        PERFORM pg_notify('workqueue', 'delayed');  -- as enqueue: learn the due time
    END IF;
    IF enqueue_many.dedupe_keys IS NULL
       OR NOT EXISTS (SELECT FROM unnest(enqueue_many.dedupe_keys) AS k WHERE k IS NOT NULL) THEN
        RETURN QUERY
        INSERT INTO pepsi.workqueue AS w (stage, payload, status, timeout, state, priority)
        SELECT enqueue_many.stage, coalesce(u.p, '{}'),
               CASE WHEN later THEN 'paused' ELSE 'pending' END,
               CASE WHEN later THEN enqueue_many.not_before END,
               CASE WHEN later THEN jsonb_build_object('delayed_until', enqueue_many.not_before)
                    ELSE '{}' END,
               coalesce(enqueue_many.priority, 0)
          FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS u(p, n)
         ORDER BY u.n
        RETURNING w.workqueue_id;
        RETURN;
    END IF;
    -- With keys.  ids[n] is element n's id; keyless elements are matched to
    -- the keyless rows inserted, both in ascending order (identity values are
    -- drawn in the order the SELECT produces the rows).
    ids := array_fill(NULL::bigint, ARRAY[cardinality(enqueue_many.payloads)]);
    LOOP
        WITH todo AS (
            SELECT u.p, u.k, u.n
              FROM unnest(enqueue_many.payloads, enqueue_many.dedupe_keys)
                   WITH ORDINALITY AS u(p, k, n)
             WHERE ids[u.n] IS NULL
        ), inserted AS (
            INSERT INTO pepsi.workqueue AS w (stage, payload, status, timeout, state, priority,
                                              dedupe_key)
            SELECT enqueue_many.stage, coalesce(t.p, '{}'),
                   CASE WHEN later THEN 'paused' ELSE 'pending' END,
                   CASE WHEN later THEN enqueue_many.not_before END,
                   CASE WHEN later THEN jsonb_build_object('delayed_until', enqueue_many.not_before)
                        ELSE '{}' END,
                   coalesce(enqueue_many.priority, 0), t.k
              FROM todo AS t
             ORDER BY t.n
            ON CONFLICT (dedupe_key)
               WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'running', 'paused')
               DO NOTHING
            RETURNING w.workqueue_id, w.dedupe_key
        ), keyless AS (
            SELECT i.workqueue_id, row_number() OVER (ORDER BY i.workqueue_id) AS r
              FROM inserted AS i WHERE i.dedupe_key IS NULL
        ), keyless_todo AS (
            SELECT t.n, row_number() OVER (ORDER BY t.n) AS r FROM todo AS t WHERE t.k IS NULL
        ), keyed AS (
            SELECT i.workqueue_id, i.dedupe_key FROM inserted AS i WHERE i.dedupe_key IS NOT NULL
        )
        SELECT array_agg(coalesce(kl.workqueue_id, kd.workqueue_id, ids[x.n]) ORDER BY x.n)
          INTO ids
          FROM generate_subscripts(ids, 1) AS x(n)
          LEFT JOIN keyless_todo AS kt ON kt.n = x.n
          LEFT JOIN keyless AS kl ON kl.r = kt.r
          LEFT JOIN keyed AS kd ON kd.dedupe_key = enqueue_many.dedupe_keys[x.n];
        -- Keys this statement did not insert: held by a live message (a
        -- concurrent one committed by now: this is a new snapshot).
        SELECT array_agg(coalesce(ids[x.n], h.workqueue_id) ORDER BY x.n)
          INTO ids
          FROM generate_subscripts(ids, 1) AS x(n)
          LEFT JOIN pepsi.workqueue AS h
                 ON ids[x.n] IS NULL
                AND h.dedupe_key = enqueue_many.dedupe_keys[x.n]
                AND h.status IN ('pending', 'running', 'paused');
        SELECT count(*) INTO missing FROM unnest(ids) AS i WHERE i IS NULL;
        EXIT WHEN missing = 0;
        -- A holder became terminal between the two statements: try those again.
    END LOOP;
    RETURN QUERY SELECT i FROM unnest(ids) WITH ORDINALITY AS u(i, n) ORDER BY u.n;
END
$$;
