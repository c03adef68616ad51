-- pepsi.copy_mark() → bigint
--   The highest message id handed out so far, for a producer that COPYs
--   rows into pepsi.workqueue (stage, payload, priority) and needs their
--   ids: read it before the COPY and again after it in the same
--   transaction.  Ids are drawn from the table's identity sequence one at a
--   time, in the order the COPY sends its rows, so when the second reading
--   minus the first equals the rows copied, the rows' ids are exactly the
--   ids between them, in row order; otherwise another producer drew ids in
--   between and pepsi.copied_ids(first reading, rows copied) returns the
--   copy's ids.
--   NULL when ids cannot be read off the sequence this way: its CACHE is
--   above 1 (each session then draws blocks ahead; take the ids with
--   pepsi.enqueue_lines instead).  Never waits: a sequence is read without
--   a lock.
--   Reads: the identity sequence of pepsi.workqueue.  Writes: nothing.
--   Callers: pepsi_ingress, pepsi_stage, pepsi_operator (SECURITY DEFINER: producers
--   have no privilege on the sequence; pepsi_dispatch.enqueue's COPY path).
CREATE OR REPLACE FUNCTION pepsi.copy_mark()
RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END
      FROM pepsi.workqueue_workqueue_id_seq AS s
     WHERE (SELECT q.seqcache FROM pg_catalog.pg_sequence AS q
             WHERE q.seqrelid = 'pepsi.workqueue_workqueue_id_seq'::regclass) = 1
$$;
