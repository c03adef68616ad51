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
-- Why v1 (migration 0011): a batch worker finishing its ids with
--   pepsi.finish over unnest(ids) paid one PL/pgSQL call and one separately
--   executed UPDATE per id: 78 µs per row for that UPDATE in
--   pg_stat_statements, against 33 µs per row for the claim's set-based
--   UPDATE.  Same predicate as finish v2: `(status = 'running') IS TRUE`
--   proves nothing about workqueue_running_idx, so the rows are found by
--   workqueue_pkey (`= ANY(ids)`).
--
-- Why v2 (migration 0023): the plan.  A LANGUAGE sql function that is not
--   inlined (SECURITY DEFINER and SET are never inlined) parses and plans
--   its body again on every call, in PostgreSQL 15 (perf showed it in a
--   one-stage SDK drain at PARALLELISM 4 x QUEUE_LIMIT 4).  v2 is the same
--   statement in PL/pgSQL, whose plan is cached for the session, and generic
--   (plan_cache_mode = force_generic_plan: the plan, workqueue_pkey for
--   `= ANY(ids)`, is the same for any array; left to choose, the plan cache
--   kept planning again for each call's array).  Same signature and result.
--
-- Why v3 (migration 0024): plans that hold however the table grows.  With
--   force_generic_plan the plan is made once per session, at the first call,
--   from the statistics of that moment.  A dispatcher or worker that starts
--   on an empty queue (the usual start) made it for an empty table: a
--   sequential scan, kept for the session's life while the table grew, until
--   an ANALYZE invalidated it (never, where autovacuum is off).  Measured: 850
--   instead of ~150 us of PostgreSQL CPU per message at the shipped stage
--   defaults.  The function now also sets enable_seqscan, enable_hashjoin and
--   enable_mergejoin off, so its plan is index scans and nested loops (the
--   plan v2 gets from fresh statistics) whatever the statistics say.
CREATE OR REPLACE FUNCTION pepsi.finish_many(ids bigint[], from_stage text,
                                             dispatcher_id bigint DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
BEGIN
    RETURN QUERY
    UPDATE pepsi.workqueue AS w
       SET status = 'done', timeout = NULL, dispatcher_id = NULL, updated_at = now()
     WHERE w.workqueue_id = ANY (finish_many.ids)
       AND w.stage = finish_many.from_stage
       AND (w.status = 'running') IS TRUE  -- not the partial index: see header
       AND (finish_many.dispatcher_id IS NULL OR w.dispatcher_id = finish_many.dispatcher_id)
    RETURNING w.workqueue_id;
END
$$;
