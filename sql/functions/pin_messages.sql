-- pepsi.pin_messages(ids bigint[], dispatcher_id bigint)
--   → table(workqueue_id bigint, stage text, status text, payload jsonb, state jsonb,
--           retries int, held_by bigint)
--   A worker's "may I start these?": reads many messages in one round trip
--   (ids that do not exist are skipped; the held rows first, in id order, then
--   the others: one index scan in the usual case, where all are held), and
--   locks, until the end of the caller's transaction, FOR NO KEY UPDATE, every
--   row of ids that is 'running' and held by dispatcher_id.  A row comes back
--   held (status 'running', held_by the dispatcher_id given) only if it is
--   locked so: no other dispatcher can reset and hand it out again until the
--   caller commits or rolls back, so a handler started on it is the only one.
--   held_by is the row's dispatcher_id (null unless running).
--   Any other row (released, reset by a replica that declared ours dead, held
--   by another dispatcher) comes back as it is, unlocked: the caller must not
--   start it.  Called in a transaction that then runs the handlers and the
--   transitions (outside one, the lock ends with the call and pins nothing).
--   Waits for a lock another role holds on a held row (a competing replica's
--   reset_orphans skips locked rows); locks in id order.
--   Reads: pepsi.workqueue (primary key).  Locks: the held rows, FOR NO KEY UPDATE.
--   Callers: pepsi_stage (SECURITY DEFINER: stage programs have no SELECT on
--   the table).
CREATE OR REPLACE FUNCTION pepsi.pin_messages(ids bigint[], dispatcher_id bigint)
RETURNS TABLE (workqueue_id bigint, stage text, status text, payload jsonb,
               state jsonb, retries integer, held_by bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    n integer;
BEGIN
    RETURN QUERY
    SELECT w.workqueue_id, w.stage, w.status, w.payload, w.state, w.retries, w.dispatcher_id
      FROM pepsi.workqueue AS w
     WHERE w.workqueue_id = ANY (pin_messages.ids)
       AND w.status = 'running'
       AND w.dispatcher_id = pin_messages.dispatcher_id
     ORDER BY w.workqueue_id
       FOR NO KEY UPDATE;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n < coalesce(cardinality(pin_messages.ids), 0) THEN
        RETURN QUERY
        SELECT w.workqueue_id, w.stage, w.status, w.payload, w.state, w.retries,
               w.dispatcher_id
          FROM pepsi.workqueue AS w
         WHERE w.workqueue_id = ANY (pin_messages.ids)
           AND NOT (w.status = 'running'
                    AND w.dispatcher_id IS NOT DISTINCT FROM pin_messages.dispatcher_id);
    END IF;
END
$$;
