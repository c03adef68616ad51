-- pepsi.requeue_matching(statuses text[] default null, in_stage text default null,
--                        older_than interval default null,
--                        payload_contains jsonb default null,
--                        reason_group text default null, before_id bigint default null,
--                        dry_run boolean default false)
--   → table(matched integer, acted integer, newest_id bigint)
--   Operator action on a filter: every message pepsi.list_messages would list
--   for these filters (same arguments, same meaning; every page, no row cap)
--   that is failed, timeout or expired goes back to pending, as
--   pepsi.requeue_failed(NULL, ids) moves it -- one call for all of them, so
--   its rules hold: retries 0, the old error under state.previous_error, a
--   dedupe key a live message carries (now, or taken while this runs) keeps
--   its row where it is, of several rows with one key only the lowest id
--   moves, kept rows come back from pepsi.dead_letters, one NOTIFY workqueue.
--   statuses: among failed, timeout, expired (NULL: all three; 22023 when it
--   names none of them).
--   matched: the messages the filter selects; acted: how many moved (0 with
--   dry_run, which only counts); newest_id: the highest id selected (NULL
--   when none).  Count first with dry_run, then act with before_id =
--   newest_id + 1: messages that arrived after the count are left alone.
--   Writes: pepsi.workqueue, pepsi.dead_letters (through requeue_failed).
--   Reads: pepsi.messages by the index the filter allows (pepsi._matching_ids).
--   Locks: the rows requeued, one key at a time for rows with a dedupe key.
--   Callers: pepsi_operator, pepsi_dashboard (SECURITY DEFINER; pepsi-queue requeue with a
--   filter, the dashboard's "Requeue all matching").
CREATE OR REPLACE FUNCTION pepsi.requeue_matching(statuses text[] DEFAULT NULL,
                                                  in_stage text DEFAULT NULL,
                                                  older_than interval DEFAULT NULL,
                                                  payload_contains jsonb DEFAULT NULL,
                                                  reason_group text DEFAULT NULL,
                                                  before_id bigint DEFAULT NULL,
                                                  dry_run boolean DEFAULT false)
RETURNS TABLE (matched integer, acted integer, newest_id bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    ids bigint[];
BEGIN
    ids := pepsi._matching_ids('requeue', ARRAY['failed', 'timeout', 'expired'],
                               requeue_matching.statuses, requeue_matching.in_stage,
                               requeue_matching.older_than, requeue_matching.payload_contains,
                               requeue_matching.reason_group, requeue_matching.before_id);
    matched := cardinality(ids);
    newest_id := ids[matched];
    acted := 0;
    IF matched > 0 AND NOT coalesce(requeue_matching.dry_run, false) THEN
        acted := pepsi.requeue_failed(NULL, ids);
    END IF;
    RETURN NEXT;
END
$$;
