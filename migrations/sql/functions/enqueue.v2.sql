-- pepsi.enqueue(stage text, payload jsonb default '{}', not_before timestamptz default null)
--   → bigint
--   Inserts one message for stage and returns its workqueue_id.
--   not_before NULL or not in the future: the row is 'pending' at once.
--   not_before in the future: a delayed message -- the row waits as 'paused'
--   with timeout = not_before, retries 0, and state->>'delayed_until' =
--   not_before (the mark, a reserved key like dispatch_error); requeue_due
--   makes it pending when due without counting a retry (it never uses up
--   MAX_RETRIES), without expiring it, and removes the mark.  A delayed row
--   is not a retry, and the workqueue keeps exactly its documented columns,
--   hence a mark in state rather than a column.
--   A NULL payload is stored as '{}'.
--   Raises 22023 for a NULL or malformed stage name or a payload that is not
--   a JSON object, 22008 for a non-finite not_before ('infinity', '-infinity').
--   Writes: pepsi.workqueue (one INSERT → one NOTIFY 'workqueue'; a delayed
--   row also sends NOTIFY 'workqueue' with payload 'delayed', on which the
--   dispatcher runs requeue_due within a second to learn the new due time --
--   plain inserts do not make it run requeue_due).
--   Locks: none beyond the insert.
--   Callers: pepsi_ingress, pepsi_stage (SECURITY DEFINER).
--   The stage is not checked against the stage registry (pepsi.stages): a
--   producer may run before the first dispatcher; pepsi-queue enqueue checks.
--
-- Why v2 (migration 0009): not_before (delayed messages) and object-only
--   payloads.  The 2-argument v1 is dropped (a 2-argument call resolves to v2
--   through the default), since both together would make every 2-argument
--   call ambiguous.
CREATE OR REPLACE FUNCTION pepsi.enqueue(stage text, payload jsonb DEFAULT '{}',
                                         not_before timestamptz DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
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
    INSERT INTO pepsi.workqueue AS w (stage, payload, status, timeout, state)
    VALUES (enqueue.stage, coalesce(enqueue.payload, '{}'),
            CASE WHEN later THEN 'paused' ELSE 'pending' END,
            CASE WHEN later THEN enqueue.not_before END,
            CASE WHEN later THEN jsonb_build_object('delayed_until', enqueue.not_before)
                 ELSE '{}' END)
    RETURNING w.workqueue_id INTO new_id;
    IF later THEN
        PERFORM pg_notify('workqueue', 'delayed');  -- learn the due time (see header)
    END IF;
    RETURN new_id;
END
$$;
