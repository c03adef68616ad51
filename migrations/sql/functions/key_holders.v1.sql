-- pepsi.key_holders(keys text[]) → table(dedupe_key text, workqueue_id bigint)
--   For a producer about to COPY keyed messages: each of `keys` that a live
--   message (pending, running or paused) carries, with that message's id;
--   keys no live message carries are not returned.  NULL elements and
--   duplicates are allowed (a key is returned once: the unique index lets
--   one live message hold it).  A look-up, not a reservation: a concurrent
--   producer may take a key that was free a moment ago, and the producer's
--   COPY then fails on workqueue_dedupe_idx (23505) once that producer
--   commits -- pepsi_dispatch.enqueue then sends the chunk through
--   pepsi.enqueue_lines, which answers with the holder's id.
--   Reads: pepsi.workqueue through workqueue_dedupe_idx (enable_seqscan off:
--   one index probe per key even when the statistics say the queue is
--   empty; plan_cache_mode force_custom_plan: planned with the array's size).
--   Writes: nothing.  Locks: none.
--   Callers: pepsi_ingress, pepsi_stage, pepsi_operator (SECURITY DEFINER: producers
--   have no SELECT on the table; pepsi_dispatch.enqueue's keyed COPY path).
CREATE OR REPLACE FUNCTION pepsi.key_holders(keys text[])
RETURNS TABLE (dedupe_key text, workqueue_id bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
SET enable_seqscan = off
SET plan_cache_mode = force_custom_plan
AS $$
    SELECT h.dedupe_key, h.workqueue_id
      FROM pepsi.workqueue AS h
     WHERE h.dedupe_key = ANY (key_holders.keys)
       AND h.dedupe_key IS NOT NULL
       AND h.status IN ('pending', 'running', 'paused');
$$;
