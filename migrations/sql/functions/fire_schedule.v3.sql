-- pepsi.fire_schedule(name text, ticks timestamptz[], stage text, payload jsonb default '{}',
--                     priority integer default 0, dedupe_key text default null,
--                     next_tick timestamptz default null)
--   → table(tick timestamptz, workqueue_id bigint, inserted boolean)
--   Enqueue schedule NAME's due ticks, each exactly once however many
--   dispatchers fire them.  Under the lock of the schedule's row in
--   pepsi.schedule_ticks (created, settled through -infinity, when missing),
--   every tick of ticks later than the row's settled_through is enqueued, in
--   ascending order, as one message for stage with that payload and
--   priority and state->>'scheduled_for' = the tick, state->>'scheduled_by'
--   = the schedule's name (reserved keys, written only here); then settled_through moves to the latest tick given and
--   last_tick to the latest tick enqueued, IN THE SAME TRANSACTION.  A second
--   caller with the same ticks waits for the lock, then reads the committed
--   row (READ COMMITTED) and enqueues nothing.
--   dedupe_key: as pepsi.enqueue's -- while the previous tick's message (or
--   any message with that key) is not terminal, the tick enqueues nothing
--   and its row names that message with inserted = false; the tick is
--   settled all the same.
--   Returns one row per tick handled (none when every tick was settled).
--   The caller computes the ticks (the cron library lives in the
--   dispatcher); ticks NULL or empty just records next_tick.
--   Raises 22023 for a malformed name or stage, a payload that is not a JSON
--   object or a bad dedupe_key; 22008 for a non-finite tick.
--   Writes: pepsi.schedule_ticks, pepsi.workqueue (one NOTIFY 'workqueue'
--   per message).  Locks: the schedule's row until commit.
--   Waits: at most lock_timeout = 200 ms (set on the function) for any lock:
--   the schedule's row (another replica firing it) or the dedupe key a
--   producer holds in an open transaction (the unique index waits for that
--   transaction).  Past it, 55P03 (lock_not_available) and nothing is
--   written: the dispatcher defers that schedule and tries again a second
--   later, so a producer's open transaction costs only that tick, never the
--   dispatcher's loop.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.fire_schedule(name text, ticks timestamptz[], stage text,
                                               payload jsonb DEFAULT '{}',
                                               priority integer DEFAULT 0,
                                               dedupe_key text DEFAULT NULL,
                                               next_tick timestamptz DEFAULT NULL)
RETURNS TABLE (tick timestamptz, workqueue_id bigint, inserted boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
SET lock_timeout = '200ms'
AS $$
#variable_conflict use_column
DECLARE
    settled timestamptz;
    t timestamptz;
    id bigint;
    fired timestamptz;
BEGIN
    IF fire_schedule.name IS NULL OR fire_schedule.name !~ '^[A-Za-z0-9_.-]+$' THEN
        RAISE EXCEPTION 'fire_schedule: invalid schedule name %',
                        coalesce(quote_literal(fire_schedule.name), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    PERFORM pepsi._check_stage(fire_schedule.stage);
    PERFORM pepsi._check_payload(fire_schedule.payload, 'payload');
    IF EXISTS (SELECT FROM unnest(fire_schedule.ticks) AS x WHERE NOT isfinite(x)) THEN
        RAISE EXCEPTION 'fire_schedule: ticks must be finite times' USING ERRCODE = '22008';
    END IF;
    IF fire_schedule.dedupe_key IS NOT NULL
       AND (fire_schedule.dedupe_key !~ '\S' OR octet_length(fire_schedule.dedupe_key) > 512) THEN
        RAISE EXCEPTION 'dedupe_key must be 1 to 512 bytes long and not only whitespace (got % bytes)',
                        octet_length(fire_schedule.dedupe_key)
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO pepsi.schedule_ticks AS s (name, stage, settled_through)
    VALUES (fire_schedule.name, fire_schedule.stage, '-infinity')
    ON CONFLICT (name) DO NOTHING;
    SELECT s.settled_through INTO settled
      FROM pepsi.schedule_ticks AS s
     WHERE s.name = fire_schedule.name
       FOR UPDATE;
    FOR t IN SELECT DISTINCT x FROM unnest(fire_schedule.ticks) AS x
              WHERE x IS NOT NULL AND x > settled ORDER BY x LOOP
        id := NULL;
        LOOP
            INSERT INTO pepsi.workqueue AS w (stage, payload, priority, dedupe_key, state)
            VALUES (fire_schedule.stage, coalesce(fire_schedule.payload, '{}'),
                    coalesce(fire_schedule.priority, 0), fire_schedule.dedupe_key,
                    jsonb_build_object('scheduled_for', t,
                                       'scheduled_by', fire_schedule.name))
            ON CONFLICT (dedupe_key)
               WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'running', 'paused')
               DO NOTHING
            RETURNING w.workqueue_id INTO id;
            IF id IS NOT NULL THEN
                fired := t;
                tick := t; workqueue_id := id; inserted := true;
                RETURN NEXT;
                EXIT;
            END IF;
            SELECT w.workqueue_id INTO id
              FROM pepsi.workqueue AS w
             WHERE w.dedupe_key = fire_schedule.dedupe_key
               AND w.status IN ('pending', 'running', 'paused');
            IF id IS NOT NULL THEN
                tick := t; workqueue_id := id; inserted := false;
                RETURN NEXT;
                EXIT;
            END IF;
        END LOOP;
    END LOOP;
    UPDATE pepsi.schedule_ticks AS s
       SET settled_through = greatest(s.settled_through,
                                      coalesce((SELECT max(x) FROM unnest(fire_schedule.ticks) AS x),
                                               s.settled_through)),
           last_tick = coalesce(fired, s.last_tick),
           next_tick = coalesce(fire_schedule.next_tick, s.next_tick),
           stage = fire_schedule.stage,
           updated_at = now()
     WHERE s.name = fire_schedule.name;
END
$$;
