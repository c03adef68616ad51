-- pepsi.cancel(ids bigint[] default null, stage text default null,
--              all_rows boolean default false) → int
--   Operator action: messages that have not started -- 'pending' or 'paused'
--   (delayed ones included) -- become 'failed' with state->>'error' =
--   'cancelled by operator'.  Selection: the rows among ids when ids is given,
--   of stage when stage is given (both: both must match), every pending and
--   paused row when all_rows.  Running and terminal rows are never touched (a
--   running row belongs to a worker; stop it by failing it there).  Returns
--   how many rows were cancelled.  A cancelled row can be requeued
--   (requeue_failed) or purged like any failed row.
--   Raises 22023 when nothing is selected (ids and stage NULL, all_rows false)
--   or when all_rows is combined with ids or stage.
--   Writes: pepsi.workqueue.  Locks: the rows cancelled (a row a claim is
--   taking at that moment is re-checked after the claim commits: it is
--   running then and skipped).
--   Callers: pepsi_dispatcher, pepsi_operator (SECURITY DEFINER; pepsi-queue: people
--   used the dispatcher's role before pepsi_operator existed).
CREATE OR REPLACE FUNCTION pepsi.cancel(ids bigint[] DEFAULT NULL, stage text DEFAULT NULL,
                                        all_rows boolean DEFAULT false)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    IF coalesce(cancel.all_rows, false) THEN
        IF cancel.ids IS NOT NULL OR cancel.stage IS NOT NULL THEN
            RAISE EXCEPTION 'cancel: all_rows cannot be combined with ids or stage'
                USING ERRCODE = '22023';
        END IF;
    ELSIF cancel.ids IS NULL AND cancel.stage IS NULL THEN
        RAISE EXCEPTION 'cancel: say which messages (ids, stage, or all_rows => true)'
            USING ERRCODE = '22023';
    END IF;
    UPDATE pepsi.workqueue AS w
       SET status = 'failed', timeout = NULL, updated_at = now(),
           state = (w.state - 'delayed_until')
                   || jsonb_build_object('error', 'cancelled by operator',
                                         'cancelled_status', w.status)
     WHERE w.status IN ('pending', 'paused')
       AND (cancel.ids IS NULL OR w.workqueue_id = ANY (cancel.ids))
       AND (cancel.stage IS NULL OR w.stage = cancel.stage);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
