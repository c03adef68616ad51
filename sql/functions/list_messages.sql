-- pepsi.list_messages(statuses text[] default null, in_stage text default null,
--                     older_than interval default null, payload_contains jsonb default null,
--                     before_id bigint default null, max_rows int default 50,
--                     reason_group text default null)
--   → table(workqueue_id bigint, stage text, status text, kind text, retries int,
--           created_at timestamptz, updated_at timestamptz, due timestamptz,
--           reason text, payload jsonb)
--   Any message, newest first: the one message list of pepsi-queue list and
--   of the dashboard's message page (pepsi-httpd).  Filters, all optional
--   and combined with AND:
--     statuses          status among these;
--     in_stage          stage = in_stage;
--     older_than        updated_at more than older_than ago: in its current
--                       status (at its current stage) for at least that long,
--                       as pepsi.purge's older_than;
--     payload_contains  the payload contains this JSON (jsonb @>);
--     reason_group      failed, timeout or expired, and the normalised reason
--                       (pepsi._normalise_reason of dispatch_error, else
--                       error, else the status) is this: one group of
--                       failed_reasons and the dashboard's failures;
--     before_id         keyset paging: the next page is before_id = the last
--                       workqueue_id of this one;
--     max_rows          at most this many, 1 … 10000 (the one cap; 22023
--                       outside it).
--   Columns:
--     kind    what status alone does not tell: delayed (paused, enqueued
--             with not_before: state.delayed_until), retry wait (paused by
--             its stage or an automatic retry), stage paused (pending in a
--             stage stage_health reports paused), cancelled (failed by
--             pepsi.cancel: state.cancelled_status); otherwise the status;
--     due     the time a paused row is due again (NULL otherwise);
--     reason  dispatch_error, else error, else (paused) pause_reason.
--   The statement is built for the filters given (pepsi._list_messages_sql:
--   the values as literals), so the planner sees them and walks an index:
--   the claim index (stage, workqueue_id) for pending rows of a stage, the
--   failure index for failed/timeout/expired, else the primary key
--   backwards; a page reads its rows and the rows it skips, never the table
--   (EXPLAIN on a million rows in tests/sql/list_messages.sql).
--   Raises 22023 for an unknown status or max_rows out of range.
--   Reads: pepsi.workqueue; stage_health when pending rows may be listed.
--   Locks: none.
--   Callers: pepsi_dispatcher, pepsi_operator, pepsi_dashboard (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.list_messages(statuses text[] DEFAULT NULL,
                                               in_stage text DEFAULT NULL,
                                               older_than interval DEFAULT NULL,
                                               payload_contains jsonb DEFAULT NULL,
                                               before_id bigint DEFAULT NULL,
                                               max_rows integer DEFAULT 50,
                                               reason_group text DEFAULT NULL)
RETURNS TABLE (workqueue_id bigint, stage text, status text, kind text, retries integer,
               created_at timestamptz, updated_at timestamptz, due timestamptz,
               reason text, payload jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    paused_stages text[];
BEGIN
    IF list_messages.statuses IS NULL OR 'pending' = ANY (list_messages.statuses) THEN
        SELECT coalesce(array_agg(h.stage), '{}') INTO paused_stages
          FROM pepsi.stage_health() AS h WHERE h.state = 'paused';
    END IF;
    RETURN QUERY EXECUTE pepsi._list_messages_sql(
        list_messages.statuses, list_messages.in_stage, list_messages.older_than,
        list_messages.payload_contains, list_messages.before_id, list_messages.max_rows,
        list_messages.reason_group, paused_stages);
END
$$;
