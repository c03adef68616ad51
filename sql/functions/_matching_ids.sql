-- pepsi._matching_ids(verb text, acts_on text[], statuses text[], in_stage text,
--                    older_than interval, payload_contains jsonb,
--                    reason_group text, before_id bigint) → bigint[]
--   The ids a bulk action selects, ascending: the messages pepsi.list_messages
--   lists for this filter (its conditions, pepsi._list_messages_where, over
--   pepsi.messages, every page at once: no max_rows) whose status is one the
--   action acts on (acts_on).  statuses NULL: all of acts_on; else the
--   statuses of both.  '{}' when nothing matches.
--   Raises 22023 when statuses names none of acts_on (a filter the action
--   can never act on: "cancel the failed messages"), and for an unknown status.
--   Reads: pepsi.workqueue, pepsi.dead_letters (the view pepsi.messages), by
--   the index the filter allows.  Locks: none (the action locks the rows it moves).
--   Callers: granted to nobody (pepsi.requeue_matching and pepsi.cancel_matching call it).
CREATE OR REPLACE FUNCTION pepsi._matching_ids(verb text, acts_on text[], statuses text[],
                                               in_stage text, older_than interval,
                                               payload_contains jsonb, reason_group text,
                                               before_id bigint)
RETURNS bigint[]
LANGUAGE plpgsql STABLE
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    wanted text[] := _matching_ids.acts_on;
    ids bigint[];
BEGIN
    IF _matching_ids.statuses IS NOT NULL THEN
        -- An unknown status is refused as list_messages refuses it.
        PERFORM pepsi._list_messages_where(_matching_ids.statuses, NULL, NULL, NULL, NULL, NULL);
        SELECT coalesce(array_agg(DISTINCT s), '{}') INTO wanted
          FROM unnest(_matching_ids.statuses) AS s
         WHERE s = ANY (_matching_ids.acts_on);
        IF cardinality(wanted) = 0 THEN
            RAISE EXCEPTION '% acts on % messages only, not on %', _matching_ids.verb,
                regexp_replace(array_to_string(_matching_ids.acts_on, ', '),
                               ', ([^,]*)$', ' or \1'),
                array_to_string(_matching_ids.statuses, ', ')
                USING ERRCODE = '22023';
        END IF;
    END IF;
    EXECUTE 'SELECT coalesce(array_agg(w.workqueue_id ORDER BY w.workqueue_id), ''{}'')'
         || ' FROM pepsi.messages AS w WHERE true'
         || pepsi._list_messages_where(wanted, _matching_ids.in_stage, _matching_ids.older_than,
                                       _matching_ids.payload_contains, _matching_ids.reason_group,
                                       _matching_ids.before_id)
       INTO ids;
    RETURN ids;
END
$$;
