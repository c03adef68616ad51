-- pepsi.message_history(id bigint)
--   → table(attempt int, stage text, started_at timestamptz, ended_at timestamptz,
--           outcome text, reason text, traceback text)
--   A message's attempts, oldest first (pepsi-queue show, the dashboard's
--   message page): the rows of pepsi.attempts (the last 20 that did not end
--   in success: paused, failed, crash, timeout, released, cancelled,
--   expired; see pepsi._record_attempt), then what the row itself says,
--   since success is never recorded (it must not cost a write):
--     * 'left' the last recorded attempt's stage, when the message is at
--       another stage now (ended_at NULL: not known), reason 'now at stage
--       STAGE' (the stages between are not recorded, so this never says it
--       went there directly);
--     * 'done' for a done row (ended_at = updated_at), 'running' for a
--       running one (started_at = updated_at).
--   attempt numbers the recorded rows (1, 2, … as they happened; the oldest
--   ones beyond 20 are dropped); derived rows have attempt NULL.  No rows
--   for an unknown id.
--   Reads: pepsi.attempts (primary key), pepsi.messages (primary keys).
--   Locks: none.
--   Callers: pepsi_dispatcher, pepsi_operator, pepsi_dashboard (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.message_history(id bigint)
RETURNS TABLE (attempt integer, stage text, started_at timestamptz, ended_at timestamptz,
               outcome text, reason text, traceback text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    w pepsi.workqueue%ROWTYPE;
    last_stage text;
BEGIN
    SELECT * INTO w FROM pepsi.messages AS q WHERE q.workqueue_id = message_history.id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT a.attempt, a.stage, a.started_at, a.ended_at, a.outcome, a.reason, a.traceback
      FROM pepsi.attempts AS a
     WHERE a.workqueue_id = message_history.id
     ORDER BY a.attempt;
    SELECT a.stage INTO last_stage
      FROM pepsi.attempts AS a
     WHERE a.workqueue_id = message_history.id
     ORDER BY a.attempt DESC LIMIT 1;
    IF last_stage IS NOT NULL AND last_stage <> w.stage THEN
        RETURN QUERY SELECT NULL::integer, last_stage, NULL::timestamptz, NULL::timestamptz,
                            'left'::text, 'now at stage ' || w.stage, NULL::text;
    END IF;
    IF w.status = 'done' THEN
        RETURN QUERY SELECT NULL::integer, w.stage, NULL::timestamptz, w.updated_at,
                            'done'::text, NULL::text, NULL::text;
    ELSIF w.status = 'running' THEN
        RETURN QUERY SELECT NULL::integer, w.stage, w.updated_at, NULL::timestamptz,
                            'running'::text, NULL::text, NULL::text;
    END IF;
END
$$;
