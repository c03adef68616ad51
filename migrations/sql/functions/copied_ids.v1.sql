-- pepsi.copied_ids(after bigint) → bigint[]
--   The ids above `after` of the messages this transaction inserted, in
--   ascending order: the ids of a COPY into pepsi.workqueue when another
--   producer drew ids while it ran (pepsi.copy_mark() says when that
--   happened; `after` is its reading before the COPY).  Rows are told apart
--   by xmin, the inserting transaction: so the COPY must run in the
--   transaction's top level (not after a SAVEPOINT, whose rows carry the
--   subtransaction's id) and be the only insert of this transaction since
--   `after` was read.  Ascending ids are the COPY's row order (each row draws
--   its id as it is inserted).  One array: 100,000 ids cost one row to send.
--   Reads: pepsi.workqueue by its primary key from `after` up (a range
--   scan; the rows of other producers in the range are read and skipped;
--   enable_seqscan off: the range is the newest ids, however many rows the
--   statistics guess above a value they cannot see).  Locks: none.
--   Callers: pepsi_ingress, pepsi_stage, pepsi_operator (SECURITY DEFINER: producers
--   have no SELECT on the table; pepsi_dispatch.enqueue's COPY path).
CREATE OR REPLACE FUNCTION pepsi.copied_ids(after bigint)
RETURNS bigint[]
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
    SELECT coalesce(array_agg(w.workqueue_id ORDER BY w.workqueue_id), '{}')
      FROM pepsi.workqueue AS w
     WHERE w.workqueue_id > copied_ids.after
       AND w.xmin = pg_current_xact_id()::xid
$$;
