-- pepsi.keep_dead_letters(batch_size integer default 1000) → integer
--   Moves up to batch_size failed, timeout and expired rows (the kept
--   terminal rows) from pepsi.workqueue to pepsi.dead_letters, each with its
--   id and every column as it was; returns how many moved.  The dispatcher
--   calls it on each heartbeat, in batches, until fewer than batch_size move.
--   Why: a kept row left in workqueue pins the leaf page of workqueue_pkey
--   (and of the other indexes) that holds its id, so VACUUM can never free
--   pages whose other rows were done and purged: the hot table's indexes
--   would grow with every id ever issued.  Moved out, workqueue holds live
--   rows and done rows within RETENTION only (docs/INTERNALS.md, "Table
--   sizes").  Readers see both tables through the view pepsi.messages.
--   Picks through workqueue_failed_idx, FOR UPDATE SKIP LOCKED: a row another
--   transaction holds (an operator's requeue or purge) is moved next time;
--   the function never waits on another role's lock.  A row whose status
--   changed meanwhile is not moved (re-checked by the DELETE).
--   Writes: pepsi.workqueue (DELETE), pepsi.dead_letters (INSERT).
--   Locks: the rows moved.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.keep_dead_letters(batch_size integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    IF coalesce(keep_dead_letters.batch_size, 0) <= 0 THEN
        RETURN 0;
    END IF;
    WITH moved AS (
        DELETE FROM pepsi.workqueue AS w
         WHERE w.workqueue_id = ANY (ARRAY(
                   SELECT k.workqueue_id
                     FROM pepsi.workqueue AS k
                    WHERE k.status IN ('failed', 'timeout', 'expired')
                    ORDER BY k.stage, k.workqueue_id
                    LIMIT keep_dead_letters.batch_size
                      FOR UPDATE SKIP LOCKED))
           AND w.status IN ('failed', 'timeout', 'expired')
        RETURNING w.workqueue_id, w.stage, w.status, w.payload, w.state, w.timeout, w.retries,
                  w.created_at, w.updated_at, w.dispatcher_id, w.priority, w.dedupe_key
    )
    INSERT INTO pepsi.dead_letters (workqueue_id, stage, status, payload, state, timeout, retries,
                                    created_at, updated_at, dispatcher_id, priority, dedupe_key)
    SELECT * FROM moved;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
