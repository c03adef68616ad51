-- pepsi.enqueue(stage text, payload jsonb default '{}', not_before timestamptz default null,
--               priority integer default 0, dedupe_key text default null)
--   → bigint
--   Inserts one message for stage and returns its workqueue_id.  Every
--   argument after stage may be given by name:
--     pepsi.enqueue('s', '{}', priority => 5, dedupe_key => 'order-17').
--   not_before NULL or not in the future: the row is 'pending' at once.
--   not_before in the future: a delayed message -- the row waits as 'paused'
--   with timeout = not_before, retries 0, and state->>'delayed_until' =
--   not_before (a reserved key); requeue_due makes it pending when due
--   without counting a retry, without expiring it, and removes the mark.
--   priority: higher is claimed first within a stage, equal priorities in id
--   order; NULL means 0; negative values are allowed.  An advance keeps it.
--   dedupe_key: while a message carrying the same key is pending, running or
--   paused (at any stage), nothing is inserted and that message's id is
--   returned; once it is terminal (done, failed -- cancelled included --,
--   timeout, expired) the key is free again.  Two sessions enqueuing the
--   same key at once get the same id and exactly one row exists: the second
--   INSERT waits on the unique index workqueue_dedupe_idx for the first
--   transaction; if that commits, ON CONFLICT DO NOTHING inserts nothing and
--   the next statement (a new snapshot) reads the committed row; if it rolls
--   back, the second insert goes through.  If the row holding the key became
--   terminal in between, the insert is simply tried again.  Under
--   REPEATABLE READ or SERIALIZABLE a key committed by a concurrent
--   transaction after the caller's snapshot raises 40001 (retry the
--   transaction), as any such conflict does.
--   A NULL payload is stored as '{}'.
--   Raises 22023 for a NULL or malformed stage name, a payload that is not a
--   JSON object, or a dedupe_key empty, only whitespace or longer than 512 bytes; 22008
--   for a non-finite not_before ('infinity', '-infinity').
--   Writes: pepsi.workqueue (one INSERT → one NOTIFY 'workqueue', also when
--   the key's conflict inserts nothing; a delayed row also sends NOTIFY
--   'workqueue' with payload 'delayed', on which the dispatcher runs
--   requeue_due within a second to learn the new due time).
--   Locks: none beyond the insert (and, with a key, the unique index entry).
--   Callers: pepsi_ingress, pepsi_stage, pepsi_operator (SECURITY DEFINER;
--   the dispatcher's schedules enqueue through fire_schedule).
--   The stage is not checked against the stage registry (pepsi.stages): a
--   producer may run before the first dispatcher; pepsi-queue enqueue checks.
CREATE OR REPLACE FUNCTION pepsi.enqueue(stage text, payload jsonb DEFAULT '{}',
                                         not_before timestamptz DEFAULT NULL,
                                         priority integer DEFAULT 0,
                                         dedupe_key text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    new_id bigint;
    later boolean := enqueue.not_before IS NOT NULL AND enqueue.not_before > now();
BEGIN
    PERFORM pepsi._check_stage(enqueue.stage);
    PERFORM pepsi._check_payload(enqueue.payload, 'payload');
    IF NOT isfinite(enqueue.not_before) THEN
        RAISE EXCEPTION 'not_before must be a finite time (got %)', enqueue.not_before
            USING ERRCODE = '22008';
    END IF;
    IF enqueue.dedupe_key IS NULL THEN
        INSERT INTO pepsi.workqueue AS w (stage, payload, status, timeout, state, priority)
        VALUES (enqueue.stage, coalesce(enqueue.payload, '{}'),
                CASE WHEN later THEN 'paused' ELSE 'pending' END,
                CASE WHEN later THEN enqueue.not_before END,
                CASE WHEN later THEN jsonb_build_object('delayed_until', enqueue.not_before)
                     ELSE '{}' END,
                coalesce(enqueue.priority, 0))
        RETURNING w.workqueue_id INTO new_id;
    ELSE
        IF enqueue.dedupe_key !~ '\S' OR octet_length(enqueue.dedupe_key) > 512 THEN
            RAISE EXCEPTION 'dedupe_key must be 1 to 512 bytes long and not only whitespace (got % bytes)',
                            octet_length(enqueue.dedupe_key)
                USING ERRCODE = '22023';
        END IF;
        LOOP
            INSERT INTO pepsi.workqueue AS w (stage, payload, status, timeout, state, priority,
                                              dedupe_key)
            VALUES (enqueue.stage, coalesce(enqueue.payload, '{}'),
                    CASE WHEN later THEN 'paused' ELSE 'pending' END,
                    CASE WHEN later THEN enqueue.not_before END,
                    CASE WHEN later THEN jsonb_build_object('delayed_until', enqueue.not_before)
                         ELSE '{}' END,
                    coalesce(enqueue.priority, 0), enqueue.dedupe_key)
            ON CONFLICT (dedupe_key)
               WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'running', 'paused')
               DO NOTHING
            RETURNING w.workqueue_id INTO new_id;
            IF new_id IS NOT NULL THEN
                EXIT;
            END IF;
            SELECT w.workqueue_id INTO new_id
              FROM pepsi.workqueue AS w
             WHERE w.dedupe_key = enqueue.dedupe_key
               AND w.status IN ('pending', 'running', 'paused');
            IF new_id IS NOT NULL THEN
                RETURN new_id;  -- the key is taken: nothing inserted, nothing delayed
            END IF;
            -- The holder became terminal between the two statements: the key is free.
        END LOOP;
    END IF;
    IF later THEN
        PERFORM pg_notify('workqueue', 'delayed');  -- learn the due time (see header)
    END IF;
    RETURN new_id;
END
$$;
