-- pepsi.note_traceback(id bigint, from_stage text, traceback text,
--                      dispatcher_id bigint default null) → boolean
--   A stage program's exception, noted just before it answers the message
--   non-zero (the Python SDK calls it; any worker may).  Applies only to a
--   row that is 'running' at from_stage (and held by dispatcher_id when
--   given), like a transition; returns whether it was noted.  The row itself
--   is not written: the text goes to pepsi.tracebacks, and the failure the
--   dispatcher then records moves it into that attempt's history row
--   (pepsi._record_attempt).  A second note for the same row replaces the
--   first.  Kept to 4000 characters: a longer traceback keeps its first 1000
--   and its last 2900 (where the exception is), joined by a line '…'.
--   Writes: pepsi.tracebacks.  Reads: pepsi.workqueue (primary key).
--   Locks: none on the row (a note for a row that moves meanwhile is
--   removed with the row's next recorded attempt or with the row).
--   Callers: pepsi_stage (SECURITY DEFINER).  Only on a failure: the success
--   path never calls it.
CREATE OR REPLACE FUNCTION pepsi.note_traceback(id bigint, from_stage text, traceback text,
                                                dispatcher_id bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    body text := note_traceback.traceback;
BEGIN
    IF body IS NULL THEN
        RETURN false;
    END IF;
    IF length(body) > 4000 THEN
        body := left(body, 1000) || E'\n…\n' || right(body, 2900);
    END IF;
    INSERT INTO pepsi.tracebacks AS t (workqueue_id, traceback)
    SELECT w.workqueue_id, body
      FROM pepsi.workqueue AS w
     WHERE w.workqueue_id = note_traceback.id
       AND w.status = 'running'
       AND w.stage = note_traceback.from_stage
       AND (note_traceback.dispatcher_id IS NULL
            OR w.dispatcher_id = note_traceback.dispatcher_id)
    ON CONFLICT (workqueue_id) DO UPDATE SET traceback = excluded.traceback, noted_at = now();
    RETURN FOUND;
END
$$;
