-- pepsi.message_story(id bigint)
--   → table(workqueue_id bigint, stage text, status text, payload jsonb, state jsonb,
--           retries int, max_retries int, delayed boolean, timeout timestamptz,
--           created_at timestamptz, updated_at timestamptz, dispatcher_id bigint,
--           error text, errors jsonb, age interval, since_update interval,
--           due_in interval, stage_registered boolean, priority int, dedupe_key text)
--   One message as an operator wants to read it (pepsi-queue show): the row
--   (its priority and dedupe key included), with
--     delayed      paused because enqueued with a future not_before;
--     error        what ended it, as failed_messages shows it: the dispatcher's
--                  dispatch_error, else the stage's error, else NULL;
--     errors       every error-like note of its state, as an object: error,
--                  dispatch_error, previous_error, and while it is paused
--                  retry_error and pause_reason (keys absent when not set);
--     max_retries  of its stage in the stage registry (NULL: not registered);
--     age          now() - created_at; since_update: now() - updated_at;
--     due_in       for a paused row, timeout - now() (negative: overdue;
--                  NULL for a non-finite timeout or another status).
--   No row when the id does not exist.
--   Reads: pepsi.workqueue (primary key), pepsi.stages.  Locks: none.
--   Callers: pepsi_dispatcher, pepsi_operator, pepsi_dashboard (SECURITY DEFINER).
--   Its attempts: pepsi.message_history.
CREATE OR REPLACE FUNCTION pepsi.message_story(id bigint)
RETURNS TABLE (workqueue_id bigint, stage text, status text, payload jsonb, state jsonb,
               retries integer, max_retries integer, delayed boolean,
               timeout timestamptz, created_at timestamptz, updated_at timestamptz,
               dispatcher_id bigint, error text, errors jsonb, age interval,
               since_update interval, due_in interval, stage_registered boolean,
               priority integer, dedupe_key text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT w.workqueue_id, w.stage, w.status, w.payload, w.state, w.retries,
           s.max_retries, w.status = 'paused' AND w.state ? 'delayed_until', w.timeout, w.created_at, w.updated_at,
           w.dispatcher_id,
           coalesce(w.state ->> 'dispatch_error', w.state ->> 'error'),
           jsonb_strip_nulls(jsonb_build_object(
               'error', w.state -> 'error',
               'dispatch_error', w.state -> 'dispatch_error',
               'retry_error', CASE WHEN w.status = 'paused' THEN w.state -> 'retry_error' END,
               'pause_reason', CASE WHEN w.status = 'paused' THEN w.state -> 'pause_reason' END,
               'previous_error', w.state -> 'previous_error')),
           now() - w.created_at,
           now() - w.updated_at,
           CASE WHEN w.status = 'paused' AND isfinite(w.timeout) THEN w.timeout - now() END,
           s.stage IS NOT NULL,
           w.priority, w.dedupe_key
      FROM pepsi.messages AS w
      LEFT JOIN pepsi.stages AS s ON s.stage = w.stage
     WHERE w.workqueue_id = message_story.id;
END
$$;
