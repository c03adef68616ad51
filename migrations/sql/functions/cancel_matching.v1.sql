-- pepsi.cancel_matching(statuses text[] default null, in_stage text default null,
--                       older_than interval default null,
--                       payload_contains jsonb default null,
--                       before_id bigint default null, dry_run boolean default false)
--   → table(matched integer, acted integer, newest_id bigint)
--   Operator action on a filter: every message pepsi.list_messages would list
--   for these filters (same arguments, same meaning; every page, no row cap)
--   that is pending or paused (delayed ones included) becomes failed with
--   state.error = 'cancelled by operator', as pepsi.cancel(ids) does it --
--   one call for all of them, so a row a worker claimed meanwhile (running)
--   is left alone.  statuses: among pending, paused (NULL: both; 22023 when
--   it names neither).  No reason_group: that filter selects failed rows,
--   which nothing cancels.
--   matched: the messages the filter selects; acted: how many were
--   cancelled (0 with dry_run, which only counts); newest_id: the highest id
--   selected (NULL when none).  Count first with dry_run, then act with
--   before_id = newest_id + 1: messages enqueued after the count are left alone.
--   Writes: pepsi.workqueue (through pepsi.cancel).
--   Reads: pepsi.messages by the index the filter allows (pepsi._matching_ids).
--   Locks: the rows cancelled.
--   Callers: pepsi_operator, pepsi_dashboard (SECURITY DEFINER; pepsi-queue cancel with a
--   filter, the dashboard's "Cancel all matching").
CREATE OR REPLACE FUNCTION pepsi.cancel_matching(statuses text[] DEFAULT NULL,
                                                 in_stage text DEFAULT NULL,
                                                 older_than interval DEFAULT NULL,
                                                 payload_contains jsonb DEFAULT NULL,
                                                 before_id bigint DEFAULT NULL,
                                                 dry_run boolean DEFAULT false)
RETURNS TABLE (matched integer, acted integer, newest_id bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    ids bigint[];
BEGIN
    ids := pepsi._matching_ids('cancel', ARRAY['pending', 'paused'],
                               cancel_matching.statuses, cancel_matching.in_stage,
                               cancel_matching.older_than, cancel_matching.payload_contains,
                               NULL, cancel_matching.before_id);
    matched := cardinality(ids);
    newest_id := ids[matched];
    acted := 0;
    IF matched > 0 AND NOT coalesce(cancel_matching.dry_run, false) THEN
        acted := pepsi.cancel(ids => ids);
    END IF;
    RETURN NEXT;
END
$$;
