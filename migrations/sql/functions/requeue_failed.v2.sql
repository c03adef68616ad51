-- pepsi.requeue_failed(stage text default null, ids bigint[] default null) → int
--   Operator action: rows in a terminal error status ('failed', 'timeout',
--   'expired') — of that stage when stage is given, among ids when ids is
--   given, all of them when both are NULL — go back to 'pending' at their
--   stage with retries 0.  Their 'error' and 'dispatch_error' keys move into
--   state->'previous_error' so the next attempt starts clean but the history
--   is kept.  Returns how many rows moved.  'done' rows are never touched.
--   When any row moved, notifies channel 'workqueue' (at commit), so the
--   dispatcher claims them at once instead of at its next poll.
--   Writes: pepsi.workqueue.  Reads: workqueue_failed_idx.
--   Locks: the rows requeued.
--   Callers: pepsi_dispatcher (operators use that role; SECURITY DEFINER).
--
-- Why v2 (migration 0009): v1 did not notify (only INSERT does), so
--   requeued rows waited up to POLL_INTERVAL (15 s measured) for a claim.
CREATE OR REPLACE FUNCTION pepsi.requeue_failed(stage text DEFAULT NULL,
                                                ids bigint[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    UPDATE pepsi.workqueue AS w
       SET status = 'pending', retries = 0, timeout = NULL, dispatcher_id = NULL,
           updated_at = now(),
           state = (w.state - 'error' - 'dispatch_error')
                   || jsonb_build_object('previous_error', jsonb_strip_nulls(jsonb_build_object(
                          'status', w.status,
                          'error', w.state -> 'error',
                          'dispatch_error', w.state -> 'dispatch_error')))
     WHERE w.status IN ('failed', 'timeout', 'expired')
       AND (requeue_failed.stage IS NULL OR w.stage = requeue_failed.stage)
       AND (requeue_failed.ids IS NULL OR w.workqueue_id = ANY (requeue_failed.ids));
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM pg_notify('workqueue', '');
    END IF;
    RETURN n;
END
$$;
