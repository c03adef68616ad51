-- pepsi.copied_ids(after bigint, copied bigint) → bigint[]
--   The ids of the `copied` rows one statement of this transaction (a COPY
--   into pepsi.workqueue) inserted above id `after`, in ascending order; NULL
--   when no statement, or more than one, inserted exactly that many there.
--   For a producer whose COPY drew ids while another producer drew some too
--   (pepsi.copy_mark() says when that happened; `after` is its reading before
--   the COPY).  Rows are told apart by xmin, the inserting transaction, and
--   cmin, the inserting command within it: so the COPY must run in the
--   transaction's top level (not after a SAVEPOINT, whose rows carry the
--   subtransaction's id), and statements another thread ran meanwhile on the
--   same connection, inside the same transaction, are not counted as the
--   COPY's.  Only rows as a COPY leaves them count (pending, not held, no
--   retry, no state): a row such a statement changed carries that
--   statement's command, and would otherwise pass for the COPY's.
--   Ascending ids are the COPY's row order (each row draws its id as it is
--   inserted).  One array: 100,000 ids cost one row to send.
--   Reads: pepsi.workqueue by its primary key from `after` up (a range
--   scan; the rows of other producers in the range are read and skipped;
--   enable_seqscan off: the range is the newest ids, however many rows the
--   statistics guess above a value they cannot see).  Locks: none.
--   Callers: pepsi_ingress, pepsi_stage, pepsi_operator (SECURITY DEFINER: producers
--   have no SELECT on the table; pepsi_dispatch.enqueue's COPY path).
CREATE OR REPLACE FUNCTION pepsi.copied_ids(after bigint, copied bigint)
RETURNS bigint[]
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
    SELECT CASE WHEN count(*) = 1 THEN min(g.ids) END
      FROM (SELECT array_agg(w.workqueue_id ORDER BY w.workqueue_id) AS ids
              FROM pepsi.workqueue AS w
             WHERE w.workqueue_id > copied_ids.after
               AND w.xmin = pg_current_xact_id()::xid
               AND w.status = 'pending' AND w.dispatcher_id IS NULL
               AND w.retries = 0 AND w.state = '{}'
             GROUP BY w.cmin::text::bigint
            HAVING count(*) = copied_ids.copied) AS g
$$;
