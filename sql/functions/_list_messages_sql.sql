-- pepsi._list_messages_sql(statuses text[], in_stage text, older_than interval,
--                         payload_contains jsonb, before_id bigint, max_rows int,
--                         reason_group text default null,
--                         paused_stages text[] default null) → text
--   The statement pepsi.list_messages runs for these filters (see there),
--   with the values as quoted literals, so the planner sees them and picks
--   the partial index that matches (tests/sql/list_messages.sql EXPLAINs
--   its output on a million rows).  paused_stages: the stages whose pending
--   rows are of kind 'stage paused' (list_messages reads them from
--   stage_health).  Validates like list_messages: 22023 for an unknown
--   status or max_rows outside 1 … 10000.  The WHERE conditions are
--   pepsi._list_messages_where's, the bulk actions' filter too.
--   Reads: nothing.
--   Callers: granted to nobody (pepsi.list_messages runs what it returns).
CREATE OR REPLACE FUNCTION pepsi._list_messages_sql(statuses text[], in_stage text,
                                                    older_than interval,
                                                    payload_contains jsonb,
                                                    before_id bigint, max_rows integer,
                                                    reason_group text DEFAULT NULL,
                                                    paused_stages text[] DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    q text;
    filter text;
BEGIN
    -- The filter first: an unknown status is refused before max_rows is checked.
    filter := pepsi._list_messages_where(
        _list_messages_sql.statuses, _list_messages_sql.in_stage, _list_messages_sql.older_than,
        _list_messages_sql.payload_contains, _list_messages_sql.reason_group,
        _list_messages_sql.before_id);
    IF _list_messages_sql.max_rows IS NULL
       OR _list_messages_sql.max_rows NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'list_messages: max_rows must be 1 … 10000, not %',
            coalesce(_list_messages_sql.max_rows::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    q := 'SELECT w.workqueue_id, w.stage, w.status,'
      || ' CASE WHEN w.status = ''paused'' AND w.state ? ''delayed_until'' THEN ''delayed'''
      || ' WHEN w.status = ''paused'' THEN ''retry wait'''
      || format(' WHEN w.status = ''pending'' AND w.stage = ANY (%L::text[])',
                coalesce(_list_messages_sql.paused_stages, '{}'))
      || ' THEN ''stage paused'''
      || ' WHEN w.status = ''failed'' AND w.state ? ''cancelled_status'' THEN ''cancelled'''
      || ' ELSE w.status END,'
      || ' w.retries, w.created_at, w.updated_at,'
      || ' CASE WHEN w.status = ''paused'' THEN w.timeout END,'
      || ' coalesce(w.state ->> ''dispatch_error'', w.state ->> ''error'','
      || ' CASE WHEN w.status = ''paused'' THEN w.state ->> ''pause_reason'' END),'
      || ' w.payload FROM pepsi.messages AS w WHERE true';
    RETURN q || filter || format(' ORDER BY w.workqueue_id DESC LIMIT %s', _list_messages_sql.max_rows);
END
$$;
