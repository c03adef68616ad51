-- pepsi.purge_done(retention interval, batch_size int default 1000) → int
--   Deletes at most batch_size 'done' rows whose updated_at is older than
--   now() - retention, oldest first, and returns how many.  The dispatcher
--   calls it on its heartbeat, so a backlog drains in small batches that
--   never hold many locks or bloat one transaction.  retention NULL or
--   <= 0 keeps everything (RETENTION = 0); failed, timeout and expired rows
--   are never purged here.
--   The history of each purged row (pepsi.attempts, pepsi.tracebacks) goes
--   with it.
--   Writes: pepsi.workqueue, pepsi.attempts, pepsi.tracebacks (DELETE).
--   Reads: workqueue_done_idx.
--   Locks: the rows deleted (SKIP LOCKED: competing replicas split batches).
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.purge_done(retention interval, batch_size integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
    gone_ids bigint[];
BEGIN
    IF purge_done.retention IS NULL OR purge_done.retention <= interval '0'
       OR coalesce(purge_done.batch_size, 0) <= 0 THEN
        RETURN 0;
    END IF;
    WITH gone AS (
        DELETE FROM pepsi.workqueue AS w
         WHERE w.workqueue_id = ANY (ARRAY(
                   SELECT d.workqueue_id
                     FROM pepsi.workqueue AS d
                    WHERE d.status = 'done' AND d.updated_at < now() - purge_done.retention
                    ORDER BY d.updated_at
                    LIMIT purge_done.batch_size
                      FOR UPDATE SKIP LOCKED))
           AND w.status = 'done'
        RETURNING w.workqueue_id
    )
    SELECT array_agg(g.workqueue_id) INTO gone_ids FROM gone AS g;
    n := coalesce(cardinality(gone_ids), 0);
    IF n > 0 THEN  -- the history of a message goes with it (retried, then done)
        DELETE FROM pepsi.attempts AS a WHERE a.workqueue_id = ANY (gone_ids);
        DELETE FROM pepsi.tracebacks AS t WHERE t.workqueue_id = ANY (gone_ids);
    END IF;
    RETURN n;
END
$$;
