-- pepsi.finish_many(ids bigint[], from_stage text, dispatcher_id bigint default null)
--   → setof bigint
--   pepsi.finish for a batch, in one statement: every row of ids that is
--   'running' at from_stage (and held by dispatcher_id when given) becomes
--   'done'; returns the ids it changed.  An id it did not change (not running
--   there, another holder, no such row) is left alone, as pepsi.finish
--   returning false would.
--   Writes: pepsi.workqueue (the rows finished).  Locks: those rows, in
--   primary-key order.
--   Callers: pepsi_stage (SECURITY DEFINER), batch workers and the SDK's
--   group commit (finishes of one stage, when the database has it).
--
-- Why (migration 0011): a batch worker finishing its ids with
--   pepsi.finish over unnest(ids) paid one PL/pgSQL call and one separately
--   executed UPDATE per id: 78 µs per row for that UPDATE in
--   pg_stat_statements, against 33 µs per row for the claim's set-based
--   UPDATE.  Same predicate as finish v2: `(status = 'running') IS TRUE`
--   proves nothing about workqueue_running_idx, so the rows are found by
--   workqueue_pkey (`= ANY(ids)`).
CREATE OR REPLACE FUNCTION pepsi.finish_many(ids bigint[], from_stage text,
                                             dispatcher_id bigint DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE sql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
    UPDATE pepsi.workqueue AS w
       SET status = 'done', timeout = NULL, dispatcher_id = NULL, updated_at = now()
     WHERE w.workqueue_id = ANY (finish_many.ids)
       AND w.stage = finish_many.from_stage
       AND (w.status = 'running') IS TRUE  -- not the partial index: see header
       AND (finish_many.dispatcher_id IS NULL OR w.dispatcher_id = finish_many.dispatcher_id)
    RETURNING w.workqueue_id;
$$;
