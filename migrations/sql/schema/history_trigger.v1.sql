-- The trigger of pepsi.attempts (migration 0018), created after its function
-- pepsi._record_attempt.  It fires only for a status change that is not a
-- success: out of 'running' to anything but 'done', 'running' (hop) or
-- 'pending' at another stage (advance); and 'pending'/'paused' to a terminal
-- status (cancel, retries exhausted, expiry).  Claims, advances, finishes,
-- hops, requeues and set_state queue no trigger event (the WHEN clause is
-- evaluated, nothing is written).
CREATE TRIGGER workqueue_attempts
    AFTER UPDATE OF status ON pepsi.workqueue
    FOR EACH ROW
    WHEN ((OLD.status = 'running' AND NEW.status NOT IN ('running', 'done')
           AND NOT (NEW.status = 'pending' AND NEW.stage <> OLD.stage))
          OR (OLD.status IN ('pending', 'paused')
              AND NEW.status IN ('failed', 'timeout', 'expired')))
    EXECUTE FUNCTION pepsi._record_attempt();
