-- pepsi.reschedule(id bigint, at timestamptz default null) → timestamptz
--   Operator action: move a waiting message's due time, now or later.
--   at NULL or not in the future means now.  Returns the message's due time
--   afterwards (its timeout; now() for a pending message left as it is).
--     paused by its stage (a pause, a retry delay): timeout = at; it stays
--       paused and requeue_due flips it when due, counting the one retry its
--       pause counts anyway (reschedule itself counts nothing, and neither
--       resets retries nor touches created_at, so EXPIRY still applies).
--     delayed (enqueued with a future not_before, state ? 'delayed_until'):
--       timeout = at and the mark follows; when due it is pending without
--       counting a retry.
--     pending: at in the future delays it like a not_before (paused,
--       timeout = at, marked delayed_until); otherwise nothing changes.
--   Sends NOTIFY 'workqueue', 'delayed' when it changed a due time, on which
--   the dispatcher runs requeue_due within a second and learns the new
--   earliest due time.
--   Raises P0002 when no message has that id; 55000 for a running message
--   (its stage holds it: only the stage may move it) and for a terminal one
--   (done, failed -- cancelled included --, timeout, expired; also one kept
--   in pepsi.dead_letters), whose error names pepsi-queue requeue /
--   pepsi.requeue_failed; 22008 for a non-finite at; 22004 for a NULL id.
--   A running message is refused at once, from a read that takes no lock:
--   its worker's pin (pin_messages) locks the row for its handler's whole
--   run, which this call never waits for.
--   Writes: pepsi.workqueue (timeout, state, status for a pending row,
--   updated_at).  Locks: a waiting row (FOR UPDATE: a claim taking a pending
--   row at the same moment is waited for, and the row is then running).
--   Callers: pepsi_dispatcher, pepsi_operator (SECURITY DEFINER; the dashboard
--   through pepsi.dashboard_reschedule).
CREATE OR REPLACE FUNCTION pepsi.reschedule(id bigint, at timestamptz DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    r record;
    due timestamptz := greatest(coalesce(reschedule.at, now()), now());
BEGIN
    IF reschedule.id IS NULL THEN
        RAISE EXCEPTION 'reschedule needs a message id' USING ERRCODE = '22004';
    END IF;
    IF NOT isfinite(reschedule.at) THEN
        RAISE EXCEPTION 'reschedule: the new due time must be finite (got %)', reschedule.at
            USING ERRCODE = '22008';
    END IF;
    -- No lock first: a running row is refused without waiting for its worker.
    SELECT w.status, w.stage INTO r
      FROM pepsi.workqueue AS w
     WHERE w.workqueue_id = reschedule.id;
    IF NOT FOUND THEN
        SELECT d.status, d.stage INTO r
          FROM pepsi.dead_letters AS d
         WHERE d.workqueue_id = reschedule.id;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'reschedule: no message %', reschedule.id USING ERRCODE = 'P0002';
    END IF;
    IF r.status IN ('pending', 'paused') THEN
        SELECT w.status, w.stage, w.state ? 'delayed_until' AS delayed INTO r
          FROM pepsi.workqueue AS w
         WHERE w.workqueue_id = reschedule.id
           FOR UPDATE;
        IF NOT FOUND THEN  -- moved to pepsi.dead_letters meanwhile: terminal
            SELECT d.status, d.stage INTO r
              FROM pepsi.dead_letters AS d
             WHERE d.workqueue_id = reschedule.id;
            IF NOT FOUND THEN  -- and purged
                RAISE EXCEPTION 'reschedule: no message %', reschedule.id
                    USING ERRCODE = 'P0002';
            END IF;
        END IF;
    END IF;
    IF r.status = 'running' THEN
        RAISE EXCEPTION 'reschedule: message % is running at stage %; only its stage can move it now',
                        reschedule.id, r.stage
            USING ERRCODE = '55000',
                  HINT = 'reschedule it once it is paused, or cancel it after its stage answered';
    ELSIF r.status = 'done' THEN
        RAISE EXCEPTION 'reschedule: message % is done (terminal); nothing is waiting to run',
                        reschedule.id
            USING ERRCODE = '55000',
                  HINT = 'enqueue a new message to run it again';
    ELSIF r.status NOT IN ('pending', 'paused') THEN
        RAISE EXCEPTION 'reschedule: message % is % (terminal); requeue it instead',
                        reschedule.id, r.status
            USING ERRCODE = '55000',
                  HINT = format('pepsi-queue requeue --id %s (pepsi.requeue_failed(ids => ARRAY[%s]))',
                                reschedule.id, reschedule.id);
    END IF;
    IF r.status = 'pending' THEN
        IF due <= now() THEN
            RETURN now();  -- already due
        END IF;
        UPDATE pepsi.workqueue AS w
           SET status = 'paused', timeout = due, updated_at = now(),
               state = w.state || jsonb_build_object('delayed_until', due)
         WHERE w.workqueue_id = reschedule.id;
    ELSE
        UPDATE pepsi.workqueue AS w
           SET timeout = due, updated_at = now(),
               state = CASE WHEN r.delayed THEN w.state || jsonb_build_object('delayed_until', due)
                            ELSE w.state END
         WHERE w.workqueue_id = reschedule.id;
    END IF;
    PERFORM pg_notify('workqueue', 'delayed');  -- the dispatcher learns the new due time
    RETURN due;
END
$$;
