-- pepsi.pause(id bigint, from_stage text, until timestamptz, reason text default null,
--             dispatcher_id bigint default null) → boolean
--   Parks a running message until a point in time: status 'paused',
--   timeout := until, dispatcher_id cleared; reason (when given) is kept in
--   state->>'pause_reason'.  requeue_due flips it back to pending at the same
--   stage once due (counting a retry).  Applies only when the row is
--   'running' at from_stage (and held by dispatcher_id when given);
--   otherwise changes nothing and returns false.
--   Raises 22004 when until is NULL (a paused row must have a timeout) and
--   22008 when until is 'infinity' or '-infinity'.
--   Writes: pepsi.workqueue (one row).  Locks: that row.
--   Callers: pepsi_stage (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.pause(id bigint, from_stage text, until timestamptz,
                                       reason text DEFAULT NULL,
                                       dispatcher_id bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    IF pause.until IS NULL THEN
        RAISE EXCEPTION 'pause needs a time to resume (until is NULL)'
            USING ERRCODE = '22004';
    END IF;
    IF NOT isfinite(pause.until) THEN
        RAISE EXCEPTION 'pause needs a finite time to resume (until is %)', pause.until
            USING ERRCODE = '22008',
                  HINT = 'fail the message instead, or pause it until a real point in time';
    END IF;
    UPDATE pepsi.workqueue AS w
       SET status = 'paused', timeout = pause.until, dispatcher_id = NULL,
           updated_at = now(),
           state = CASE WHEN pause.reason IS NULL THEN w.state
                        ELSE w.state || jsonb_build_object('pause_reason', pause.reason) END
     WHERE w.workqueue_id = pause.id
       AND w.stage = pause.from_stage
       AND (w.status = 'running') IS TRUE  -- not the partial index: see header
       AND (pause.dispatcher_id IS NULL OR w.dispatcher_id = pause.dispatcher_id);
    RETURN FOUND;
END
$$;
