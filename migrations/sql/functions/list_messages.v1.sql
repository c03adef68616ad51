-- pepsi.list_messages(statuses text[] default null, in_stage text default null,
--                     older_than interval default null, payload_contains jsonb default null,
--                     before_id bigint default null, max_rows int default 50)
--   → table(workqueue_id bigint, stage text, status text, retries int,
--           created_at timestamptz, updated_at timestamptz, due timestamptz,
--           reason text, payload jsonb)
--   Any message, newest first (pepsi-queue list, the dashboard's message
--   list).  Filters, all optional and combined with AND: status among
--   statuses; stage = in_stage; created more than older_than ago; payload
--   containing payload_contains (jsonb @>).  Keyset paging: the next page is
--   before_id = the last workqueue_id of this one.  At most max_rows
--   (1 … 10000) rows.
--     due     the time a paused row is due again (NULL otherwise);
--     reason  dispatch_error, else error, else (paused) pause_reason.
--   The statement is built for the filters given (pepsi._list_messages_sql:
--   the values as literals), so the planner sees them and walks an index:
--   the claim index (stage, workqueue_id) for pending rows of a stage, the
--   failure index for failed/timeout/expired, else the primary key
--   backwards; a page reads its rows and the rows it skips, never the table
--   (EXPLAIN on a million rows in tests/sql/list_messages.sql).
--   Raises 22023 for an unknown status or max_rows out of range.
--   Reads: pepsi.workqueue.  Locks: none.
--   Callers: pepsi_dispatcher, pepsi_operator, pepsi_dashboard (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.list_messages(statuses text[] DEFAULT NULL,
                                               in_stage text DEFAULT NULL,
                                               older_than interval DEFAULT NULL,
                                               payload_contains jsonb DEFAULT NULL,
                                               before_id bigint DEFAULT NULL,
                                               max_rows integer DEFAULT 50)
RETURNS TABLE (workqueue_id bigint, stage text, status text, retries integer,
               created_at timestamptz, updated_at timestamptz, due timestamptz,
               reason text, payload jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY EXECUTE pepsi._list_messages_sql(
        list_messages.statuses, list_messages.in_stage, list_messages.older_than,
        list_messages.payload_contains, list_messages.before_id, list_messages.max_rows);
END
$$;
