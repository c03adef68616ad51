-- pepsi._list_messages_where(statuses text[], in_stage text, older_than interval,
--                           payload_contains jsonb, reason_group text,
--                           before_id bigint) → text
--   The filter of pepsi.list_messages (see there for what each argument
--   selects) as SQL conditions on pepsi.messages AS w, each opening with
--   ' AND ', the values as quoted literals: '' for no filter.  The one copy
--   of the message list's filter: pepsi._list_messages_sql puts it in the
--   list's statement, pepsi._matching_ids in the count and the selection of
--   the bulk actions (requeue_matching, cancel_matching), so "the messages
--   this filter lists" and "the messages it requeues or cancels" cannot
--   drift apart.  Raises 22023 for an unknown status.
--   Reads: nothing.
--   Callers: granted to nobody (pepsi._list_messages_sql and pepsi._matching_ids call it).
CREATE OR REPLACE FUNCTION pepsi._list_messages_where(statuses text[], in_stage text,
                                                      older_than interval,
                                                      payload_contains jsonb,
                                                      reason_group text, before_id bigint)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    q text := '';
    bad text;
BEGIN
    SELECT s INTO bad FROM unnest(_list_messages_where.statuses) AS s
     WHERE s IS NULL OR s NOT IN ('pending', 'running', 'paused', 'done', 'failed',
                                  'timeout', 'expired')
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'list_messages: unknown status %', coalesce(quote_literal(bad), 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'pending, running, paused, done, failed, timeout or expired';
    END IF;
    IF cardinality(_list_messages_where.statuses) = 1 THEN
        q := q || format(' AND w.status = %L', _list_messages_where.statuses[1]);
    ELSIF cardinality(_list_messages_where.statuses) > 1 THEN
        q := q || format(' AND w.status IN (%s)',
                         (SELECT string_agg(DISTINCT quote_literal(s), ', ')
                            FROM unnest(_list_messages_where.statuses) AS s));
    END IF;
    IF _list_messages_where.in_stage IS NOT NULL THEN
        q := q || format(' AND w.stage = %L', _list_messages_where.in_stage);
    END IF;
    IF _list_messages_where.older_than IS NOT NULL THEN
        q := q || format(' AND w.updated_at < now() - %L::interval',
                         _list_messages_where.older_than);
    END IF;
    IF _list_messages_where.payload_contains IS NOT NULL THEN
        q := q || format(' AND w.payload @> %L::jsonb', _list_messages_where.payload_contains);
    END IF;
    IF _list_messages_where.reason_group IS NOT NULL THEN
        q := q || ' AND w.status IN (''failed'', ''timeout'', ''expired'')'
               || format(' AND pepsi._normalise_reason(coalesce(w.state ->> ''dispatch_error'','
                         ' w.state ->> ''error'', w.status)) = %L',
                         _list_messages_where.reason_group);
    END IF;
    IF _list_messages_where.before_id IS NOT NULL THEN
        q := q || format(' AND w.workqueue_id < %s', _list_messages_where.before_id);
    END IF;
    RETURN q;
END
$$;
