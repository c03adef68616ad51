-- pepsi._record_attempt() → trigger
--   The trigger function of workqueue_attempts (AFTER UPDATE OF status, FOR
--   EACH ROW, with a WHEN clause that lets only non-success endings through:
--   see the trigger workqueue_attempts in migrations/head_schema.sql).  Appends one row to
--   pepsi.attempts for the message: the stage that ran (OLD.stage), when the
--   attempt started (OLD.updated_at for a row leaving 'running': its claim, or
--   its last set_state; NULL otherwise), when it ended (now()), the outcome
--   and the reason:
--     running → pending (same stage)   released   (release, reset_orphans, exit 75)
--     running → timeout                timeout    dispatch_error
--     running → paused, pause_reason   crash/timeout/failed, retry_error
--        newly 'automatic retry …'       (an automatic retry of a dispatcher failure)
--     running → paused otherwise       paused     pause_reason (NULL when the
--                                                  stage gave none)
--     running → failed, new dispatch_error  crash (worker exited/killed) or
--                                           failed (answer, protocol error)
--     running → failed otherwise       failed     error (pepsi.fail)
--     pending/paused → failed, error 'cancelled…'  cancelled
--     pending/paused → expired         expired
--     pending/paused → failed/timeout  failed     (retries exhausted, …)
--   A traceback the SDK noted for the row (pepsi.tracebacks) is moved into
--   the attempt row.  Only the last 20 attempts of a message are kept.
--   Reasons are cut at 2000 characters.
--   Writes: pepsi.attempts, pepsi.tracebacks (delete).  Locks: none beyond
--   the row the UPDATE already holds (attempts of one message are numbered
--   under that row lock).
--   Callers: granted to nobody (the trigger only; SECURITY DEFINER so a
--   caller's role needs no privilege on the history tables).
CREATE OR REPLACE FUNCTION pepsi._record_attempt()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    outcome text;
    why text;
    tb text;
    began timestamptz;
    n integer;
BEGIN
    IF OLD.status = 'running' THEN
        began := OLD.updated_at;
        IF NEW.status = 'pending' THEN
            outcome := 'released';
        ELSIF NEW.status = 'timeout' THEN
            outcome := 'timeout';
            why := NEW.state ->> 'dispatch_error';
        ELSIF NEW.status = 'paused' THEN
            IF (NEW.state ->> 'pause_reason') LIKE 'automatic retry %'
               AND (NEW.state -> 'pause_reason') IS DISTINCT FROM (OLD.state -> 'pause_reason') THEN
                why := NEW.state ->> 'retry_error';
                outcome := CASE WHEN why ~ '^worker (exited|killed)' THEN 'crash'
                                WHEN why ~* '^(timeout|timed out)|MAX_RUNTIME' THEN 'timeout'
                                ELSE 'failed' END;
            ELSE
                outcome := 'paused';
                why := NEW.state ->> 'pause_reason';
                IF why LIKE 'automatic retry %' THEN
                    why := NULL;  -- an earlier retry's note: this pause gave no reason
                END IF;
            END IF;
        ELSIF (NEW.state -> 'dispatch_error') IS DISTINCT FROM (OLD.state -> 'dispatch_error') THEN
            why := NEW.state ->> 'dispatch_error';
            outcome := CASE WHEN why ~ '^worker (exited|killed)' THEN 'crash' ELSE 'failed' END;
        ELSE
            outcome := 'failed';
            why := coalesce(NEW.state ->> 'error', NEW.state ->> 'dispatch_error');
        END IF;
        DELETE FROM pepsi.tracebacks AS t WHERE t.workqueue_id = NEW.workqueue_id
        RETURNING t.traceback INTO tb;
    ELSIF NEW.status = 'expired' THEN
        outcome := 'expired';
        why := 'expired';
    ELSIF NEW.status = 'failed' AND (NEW.state ->> 'error') LIKE 'cancelled%'
          AND (NEW.state -> 'error') IS DISTINCT FROM (OLD.state -> 'error') THEN
        outcome := 'cancelled';
        why := NEW.state ->> 'error';
    ELSE
        outcome := 'failed';
        why := coalesce(NEW.state ->> 'dispatch_error', NEW.state ->> 'error', NEW.status);
    END IF;
    SELECT coalesce(max(a.attempt), 0) + 1 INTO n
      FROM pepsi.attempts AS a WHERE a.workqueue_id = NEW.workqueue_id;
    INSERT INTO pepsi.attempts (workqueue_id, attempt, stage, started_at, ended_at,
                                outcome, reason, traceback)
    VALUES (NEW.workqueue_id, n, OLD.stage, began, now(), outcome, left(why, 2000), tb);
    IF n > 20 THEN
        DELETE FROM pepsi.attempts AS a
         WHERE a.workqueue_id = NEW.workqueue_id AND a.attempt <= n - 20;
    END IF;
    RETURN NULL;
END
$$;
