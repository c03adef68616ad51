-- pepsi.purge(statuses text[], stage text default null,
--             older_than interval default null, dry_run boolean default false) → bigint
--   Operator action: deletes rows in the given terminal statuses ('done',
--   'failed', 'timeout', 'expired'; anything else raises 22023), of that
--   stage when given, last updated longer than older_than ago when given.
--   Pending, running and paused rows are never deleted.  Returns the count.
--   dry_run: deletes nothing and returns how many rows would be deleted.
--   Rows kept in pepsi.dead_letters are purged too, and every purged row's
--   history (pepsi.attempts, pepsi.tracebacks) with it.
--   Writes: pepsi.workqueue, pepsi.dead_letters, pepsi.attempts,
--   pepsi.tracebacks (not with dry_run).  Locks: the rows deleted.
--   Callers: pepsi_dispatcher, pepsi_operator (SECURITY DEFINER; pepsi-queue: people
--   used the dispatcher's role before pepsi_operator existed).
CREATE OR REPLACE FUNCTION pepsi.purge(statuses text[], stage text DEFAULT NULL,
                                       older_than interval DEFAULT NULL,
                                       dry_run boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    n bigint;
    gone_ids bigint[];
BEGIN
    IF purge.statuses IS NULL OR cardinality(purge.statuses) = 0
       OR NOT purge.statuses <@ ARRAY['done', 'failed', 'timeout', 'expired'] THEN
        RAISE EXCEPTION 'purge deletes only terminal rows: statuses must be among done, failed, timeout, expired (got %)',
                        coalesce(purge.statuses::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF coalesce(purge.dry_run, false) THEN
        SELECT count(*) INTO n
          FROM pepsi.messages AS w
         WHERE w.status = ANY (purge.statuses)
           AND (purge.stage IS NULL OR w.stage = purge.stage)
           AND (purge.older_than IS NULL OR w.updated_at < now() - purge.older_than);
        RETURN n;
    END IF;
    WITH gone AS (
        DELETE FROM pepsi.workqueue AS w
         WHERE w.status = ANY (purge.statuses)
           AND (purge.stage IS NULL OR w.stage = purge.stage)
           AND (purge.older_than IS NULL OR w.updated_at < now() - purge.older_than)
        RETURNING w.workqueue_id
    ), kept_gone AS (
        DELETE FROM pepsi.dead_letters AS d
         WHERE d.status = ANY (purge.statuses)
           AND (purge.stage IS NULL OR d.stage = purge.stage)
           AND (purge.older_than IS NULL OR d.updated_at < now() - purge.older_than)
        RETURNING d.workqueue_id
    )
    SELECT array_agg(x.workqueue_id) INTO gone_ids
      FROM (SELECT g.workqueue_id FROM gone AS g
            UNION ALL SELECT k.workqueue_id FROM kept_gone AS k) AS x;
    n := coalesce(cardinality(gone_ids), 0);
    IF n > 0 THEN
        DELETE FROM pepsi.attempts AS a WHERE a.workqueue_id = ANY (gone_ids);
        DELETE FROM pepsi.tracebacks AS t WHERE t.workqueue_id = ANY (gone_ids);
    END IF;
    RETURN n;
END
$$;
