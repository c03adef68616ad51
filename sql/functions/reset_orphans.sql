-- pepsi.reset_orphans(dispatcher_id bigint, competing boolean, orphan_timeout interval) → int
--   Puts running rows nobody alive holds back to 'pending' (dispatcher_id
--   cleared, retries unchanged) and returns how many.
--   Non-competing (the caller holds the database's advisory lock
--   exclusively, so it is the only live dispatcher): every running row not
--   held by dispatcher_id, and every other registration is removed.
--   Competing: running rows of dispatchers whose heartbeat is older than
--   orphan_timeout, or that are not registered at all; those stale
--   dispatchers are removed from the registry.  The caller's own rows are
--   never touched.  (A replica whose session is gone but whose heartbeat is
--   younger is not removed -- it may be re-establishing its connection with
--   its workers still running -- but nothing counts or exports it: see
--   pepsi._dispatcher_live.)
--   Competing, a row some session holds locked is skipped, not waited for
--   (a worker of the dead replica pins the rows whose handlers run:
--   pin_messages): its dispatcher is no longer registered, so the next call
--   (every replica's heartbeat) resets it once the lock is gone, unless that
--   dispatcher comes back first (it then releases what it still holds).
--   Writes: pepsi.workqueue, pepsi.dispatchers.  Reads: workqueue_running_idx.
--   Locks: the rows reset (competing: SKIP LOCKED), the registrations removed.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.reset_orphans(dispatcher_id bigint, competing boolean,
                                               orphan_timeout interval)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    IF coalesce(reset_orphans.competing, false) THEN
        DELETE FROM pepsi.dispatchers AS d
         WHERE d.dispatcher_id IS DISTINCT FROM reset_orphans.dispatcher_id
           AND d.heartbeat_at < now() - coalesce(reset_orphans.orphan_timeout, interval '0');
        UPDATE pepsi.workqueue AS w
           SET status = 'pending', dispatcher_id = NULL, updated_at = now()
         WHERE w.workqueue_id IN (
                   SELECT o.workqueue_id
                     FROM pepsi.workqueue AS o
                    WHERE o.status = 'running'
                      AND o.dispatcher_id IS DISTINCT FROM reset_orphans.dispatcher_id
                      AND NOT EXISTS (SELECT 1 FROM pepsi.dispatchers AS d
                                       WHERE d.dispatcher_id = o.dispatcher_id)
                      FOR UPDATE SKIP LOCKED)
           AND w.status = 'running';
    ELSE
        DELETE FROM pepsi.dispatchers AS d
         WHERE d.dispatcher_id IS DISTINCT FROM reset_orphans.dispatcher_id;
        UPDATE pepsi.workqueue AS w
           SET status = 'pending', dispatcher_id = NULL, updated_at = now()
         WHERE w.status = 'running'
           AND w.dispatcher_id IS DISTINCT FROM reset_orphans.dispatcher_id;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
