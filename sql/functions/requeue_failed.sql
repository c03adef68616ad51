-- pepsi.requeue_failed(stage text default null, ids bigint[] default null) → int
--   Operator action: rows in a terminal error status ('failed', 'timeout',
--   'expired') — of that stage when stage is given, among ids when ids is
--   given, all of them when both are NULL — go back to 'pending' at their
--   stage with retries 0.  Their 'error' and 'dispatch_error' keys move into
--   state->'previous_error' so the next attempt starts clean but the history
--   is kept.  Returns how many rows moved.  'done' rows are never touched.
--   When any row moved, notifies channel 'workqueue' (at commit), so the
--   dispatcher claims them at once instead of at its next poll.
--   Dedupe keys: a row whose dedupe_key a pending, running or paused
--   message carries now stays where it is, and of several selected rows
--   with one key only the lowest id moves (it takes the key again):
--   requeueing never queues one key twice.  A key a producer takes while
--   the requeue runs (committed meanwhile, or in a transaction that commits
--   while the requeue waits for it) leaves that row where it is too: the
--   rows with a key move one at a time, each in a subtransaction that turns
--   the unique violation into "not moved", so the requeue never raises 23505
--   and the other rows still move.
--   Kept rows are found in pepsi.dead_letters too and come back into
--   pepsi.workqueue with their ids.
--   Writes: pepsi.workqueue, pepsi.dead_letters.  Reads: workqueue_failed_idx,
--   dead_letters_stage_idx.
--   Locks: the rows requeued.  Waits on a producer's open transaction that
--   inserted one of the keys (the unique index), only for that row.
--   Callers: pepsi_dispatcher, pepsi_operator (SECURITY DEFINER; pepsi-queue: people
--   used the dispatcher's role before pepsi_operator existed).
CREATE OR REPLACE FUNCTION pepsi.requeue_failed(stage text DEFAULT NULL,
                                                ids bigint[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    n integer := 0;
    moved integer;
    batch record;
BEGIN
    -- Kept rows live in dead_letters (keep_dead_letters): the selected ones
    -- come back into workqueue first, with their ids and status; a row that
    -- then stays failed (its key taken) is moved out again by the next
    -- keep_dead_letters.
    -- Only when there are such rows: the INSERT's statement trigger notifies
    -- even for no row, and a requeue that moves nothing says nothing.
    IF EXISTS (SELECT FROM pepsi.dead_letters AS d
                WHERE (requeue_failed.stage IS NULL OR d.stage = requeue_failed.stage)
                  AND (requeue_failed.ids IS NULL OR d.workqueue_id = ANY (requeue_failed.ids))) THEN
    WITH back AS (
        DELETE FROM pepsi.dead_letters AS d
         WHERE (requeue_failed.stage IS NULL OR d.stage = requeue_failed.stage)
           AND (requeue_failed.ids IS NULL OR d.workqueue_id = ANY (requeue_failed.ids))
        RETURNING d.workqueue_id, d.stage, d.status, d.payload, d.state, d.timeout, d.retries,
                  d.created_at, d.updated_at, d.dispatcher_id, d.priority, d.dedupe_key
    )
    INSERT INTO pepsi.workqueue
           (workqueue_id, stage, status, payload, state, timeout, retries, created_at,
            updated_at, dispatcher_id, priority, dedupe_key)
    OVERRIDING SYSTEM VALUE
    SELECT * FROM back;
    END IF;
    -- The rows without a key as one batch, then the lowest id of each key
    -- alone (a batch of one), so a key taken meanwhile costs only its row.
    FOR batch IN
        SELECT array_agg(w.workqueue_id) AS ids
          FROM pepsi.workqueue AS w
         WHERE w.status IN ('failed', 'timeout', 'expired') AND w.dedupe_key IS NULL
           AND (requeue_failed.stage IS NULL OR w.stage = requeue_failed.stage)
           AND (requeue_failed.ids IS NULL OR w.workqueue_id = ANY (requeue_failed.ids))
        UNION ALL
        SELECT ARRAY[k.workqueue_id]
          FROM (SELECT DISTINCT ON (w.dedupe_key) w.workqueue_id
                  FROM pepsi.workqueue AS w
                 WHERE w.status IN ('failed', 'timeout', 'expired') AND w.dedupe_key IS NOT NULL
                   AND (requeue_failed.stage IS NULL OR w.stage = requeue_failed.stage)
                   AND (requeue_failed.ids IS NULL OR w.workqueue_id = ANY (requeue_failed.ids))
                 ORDER BY w.dedupe_key, w.workqueue_id) AS k
    LOOP
        CONTINUE WHEN batch.ids IS NULL;
        BEGIN
            UPDATE pepsi.workqueue AS w
               SET status = 'pending', retries = 0, timeout = NULL, dispatcher_id = NULL,
                   updated_at = now(),
                   state = (w.state - 'error' - 'dispatch_error')
                           || jsonb_build_object('previous_error', jsonb_strip_nulls(jsonb_build_object(
                                  'status', w.status,
                                  'error', w.state -> 'error',
                                  'dispatch_error', w.state -> 'dispatch_error')))
             WHERE w.workqueue_id = ANY (batch.ids)
               AND w.status IN ('failed', 'timeout', 'expired')
               AND (w.dedupe_key IS NULL
                    OR NOT EXISTS (SELECT FROM pepsi.workqueue AS h
                                    WHERE h.dedupe_key = w.dedupe_key
                                      AND h.status IN ('pending', 'running', 'paused')));
            GET DIAGNOSTICS moved = ROW_COUNT;
            n := n + moved;
        EXCEPTION WHEN unique_violation THEN
            NULL;  -- the key was taken meanwhile: this row stays where it is
        END;
    END LOOP;
    IF n > 0 THEN
        PERFORM pg_notify('workqueue', '');
    END IF;
    RETURN n;
END
$$;
