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
--   status or max_rows outside 1 … 10000.
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
    bad text;
BEGIN
    SELECT s INTO bad FROM unnest(_list_messages_sql.statuses) AS s
     WHERE s IS NULL OR s NOT IN ('pending', 'running', 'paused', 'done', 'failed',
                                  'timeout', 'expired')
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'list_messages: unknown status %', coalesce(quote_literal(bad), 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'pending, running, paused, done, failed, timeout or expired';
    END IF;
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
    IF cardinality(_list_messages_sql.statuses) = 1 THEN
        q := q || format(' AND w.status = %L', _list_messages_sql.statuses[1]);
    ELSIF cardinality(_list_messages_sql.statuses) > 1 THEN
        q := q || format(' AND w.status IN (%s)',
                         (SELECT string_agg(DISTINCT quote_literal(s), ', ')
                            FROM unnest(_list_messages_sql.statuses) AS s));
    END IF;
    IF _list_messages_sql.in_stage IS NOT NULL THEN
        q := q || format(' AND w.stage = %L', _list_messages_sql.in_stage);
    END IF;
    IF _list_messages_sql.older_than IS NOT NULL THEN
        q := q || format(' AND w.updated_at < now() - %L::interval', _list_messages_sql.older_than);
    END IF;
    IF _list_messages_sql.payload_contains IS NOT NULL THEN
        q := q || format(' AND w.payload @> %L::jsonb', _list_messages_sql.payload_contains);
    END IF;
    IF _list_messages_sql.reason_group IS NOT NULL THEN
        q := q || ' AND w.status IN (''failed'', ''timeout'', ''expired'')'
               || format(' AND pepsi._normalise_reason(coalesce(w.state ->> ''dispatch_error'','
                         ' w.state ->> ''error'', w.status)) = %L',
                         _list_messages_sql.reason_group);
    END IF;
    IF _list_messages_sql.before_id IS NOT NULL THEN
        q := q || format(' AND w.workqueue_id < %s', _list_messages_sql.before_id);
    END IF;
    RETURN q || format(' ORDER BY w.workqueue_id DESC LIMIT %s', _list_messages_sql.max_rows);
END
$$;
