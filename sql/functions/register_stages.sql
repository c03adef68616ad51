-- pepsi.register_stages(dispatcher_id bigint, stages text[], nexts text[],
--                       max_retries int[], retry_delays interval[],
--                       retry_delay_maxes interval[], parallelisms int[],
--                       queue_limits int[]) → int
--   Records the stage table a dispatcher routes by (configuration file plus
--   overlay) in pepsi.stages, set-based: the given stages are upserted, every
--   other row is deleted, so the table is exactly this set afterwards.
--   Arrays are aligned with stages; nexts[i] is the space-separated NEXT list
--   of stages[i] ('' or NULL: final); retry_delays[i] NULL means no automatic
--   retries (RETRY_DELAY unset); retry_delay_maxes[i] NULL means no cap;
--   max_retries[i] NULL means 10; parallelisms / queue_limits are shown to
--   operators only.  A NULL or empty stages array empties the registry.
--   Returns the number of stages registered.
--   Raises 22023 when the arrays differ in length, a stage name is invalid,
--   or a stage appears twice.
--   Writes: pepsi.stages.  Locks: its rows (competing replicas registering at
--   once serialise on them; the last one wins).
--   Callers: pepsi_dispatcher (SECURITY DEFINER; at start and after every reload).
CREATE OR REPLACE FUNCTION pepsi.register_stages(dispatcher_id bigint, stages text[],
                                                 nexts text[], max_retries integer[],
                                                 retry_delays interval[],
                                                 retry_delay_maxes interval[],
                                                 parallelisms integer[],
                                                 queue_limits integer[])
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    n integer := coalesce(cardinality(register_stages.stages), 0);
    bad text;
BEGIN
    IF coalesce(cardinality(register_stages.nexts), n) <> n
       OR coalesce(cardinality(register_stages.max_retries), n) <> n
       OR coalesce(cardinality(register_stages.retry_delays), n) <> n
       OR coalesce(cardinality(register_stages.retry_delay_maxes), n) <> n
       OR coalesce(cardinality(register_stages.parallelisms), n) <> n
       OR coalesce(cardinality(register_stages.queue_limits), n) <> n THEN
        RAISE EXCEPTION 'register_stages: arrays differ in length' USING ERRCODE = '22023';
    END IF;
    FOR bad IN SELECT s FROM unnest(register_stages.stages) AS s LOOP
        PERFORM pepsi._check_stage(bad);
    END LOOP;
    SELECT s INTO bad FROM unnest(register_stages.stages) AS s GROUP BY s HAVING count(*) > 1
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'register_stages: stage % given twice', bad USING ERRCODE = '22023';
    END IF;

    DELETE FROM pepsi.stages AS s
     WHERE NOT (s.stage = ANY (coalesce(register_stages.stages, '{}')));
    INSERT INTO pepsi.stages AS s (stage, next, max_retries, retry_delay, retry_delay_max,
                                   parallelism, queue_limit, updated_at, dispatcher_id)
    SELECT u.stage,
           coalesce(string_to_array(nullif(btrim(u.nxt), ''), ' '), '{}'),
           coalesce(u.mr, 10), u.rd, u.rdm, u.par, u.ql, now(),
           register_stages.dispatcher_id
      FROM unnest(register_stages.stages, register_stages.nexts, register_stages.max_retries,
                  register_stages.retry_delays, register_stages.retry_delay_maxes,
                  register_stages.parallelisms, register_stages.queue_limits)
           AS u(stage, nxt, mr, rd, rdm, par, ql)
    ON CONFLICT (stage) DO UPDATE
       SET next = EXCLUDED.next, max_retries = EXCLUDED.max_retries,
           retry_delay = EXCLUDED.retry_delay, retry_delay_max = EXCLUDED.retry_delay_max,
           parallelism = EXCLUDED.parallelism, queue_limit = EXCLUDED.queue_limit,
           updated_at = now(), dispatcher_id = EXCLUDED.dispatcher_id;
    RETURN n;
END
$$;
