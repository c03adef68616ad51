-- pepsi.dashboard_messages(in_status text default null, in_stage text default null,
--                          older_than interval default null, match jsonb default null,
--                          reason_group text default null, max_rows int default 100,
--                          before_id bigint default null)
--   → table(workqueue_id bigint, stage text, status text, kind text,
--           retries int, due timestamptz, reason text, payload_preview text,
--           created_at timestamptz, updated_at timestamptz)
--   The dashboard's message list, for any status, newest first:
--     in_status     only rows in this status (any when NULL);
--     in_stage      only rows of this stage;
--     older_than    only rows whose updated_at is older than this (in their
--                   status for at least that long);
--     match         only rows whose payload contains this JSON (jsonb @>);
--     reason_group  only rows whose normalised reason
--                   (pepsi._normalise_reason) is this -- a group of the
--                   dashboard's failures by reason;
--     before_id     paging: only ids below this (the last id of the page
--                   before);
--     max_rows      at most this many (1 … 1000; NULL 100).
--   kind tells apart what status alone does not:
--     delayed       paused, enqueued with not_before (state.delayed_until);
--     retry wait    paused by the stage or by an automatic retry;
--     stage paused  pending in a stage that is PAUSED (stage_health);
--     cancelled     failed by an operator's cancel (state.cancelled_status);
--     otherwise the status.
--   due: when a paused row is due again (its timeout), else NULL.
--   reason: dispatch_error, else error, else pause_reason.
--   payload_preview: the payload's text, cut at 200 characters.
--   Plan: a backward walk of the primary key from before_id, stopping at
--   max_rows matches (keyset paging: each page costs the same).  A filter
--   that matches few rows of a big table reads more of it; this is the
--   operator's page, not a hot path.
--   Reads: pepsi.workqueue; stage_health when rows are pending.
--   Writes: nothing.  Locks: none.
--   Callers: pepsi_dashboard (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.dashboard_messages(in_status text DEFAULT NULL,
                                                    in_stage text DEFAULT NULL,
                                                    older_than interval DEFAULT NULL,
                                                    match jsonb DEFAULT NULL,
                                                    reason_group text DEFAULT NULL,
                                                    max_rows integer DEFAULT 100,
                                                    before_id bigint DEFAULT NULL)
RETURNS TABLE (workqueue_id bigint, stage text, status text, kind text, retries integer,
               due timestamptz, reason text, payload_preview text,
               created_at timestamptz, updated_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    paused_stages text[];
BEGIN
    IF dashboard_messages.in_status IS NULL OR dashboard_messages.in_status = 'pending' THEN
        SELECT coalesce(array_agg(h.stage), '{}') INTO paused_stages
          FROM pepsi.stage_health() AS h WHERE h.state = 'paused';
    END IF;
    RETURN QUERY
    SELECT w.workqueue_id, w.stage, w.status,
           CASE WHEN w.status = 'paused' AND w.state ? 'delayed_until' THEN 'delayed'
                WHEN w.status = 'paused' THEN 'retry wait'
                WHEN w.status = 'pending' AND w.stage = ANY (paused_stages) THEN 'stage paused'
                WHEN w.status = 'failed' AND w.state ? 'cancelled_status' THEN 'cancelled'
                ELSE w.status END,
           w.retries,
           CASE WHEN w.status = 'paused' THEN w.timeout END,
           coalesce(w.state ->> 'dispatch_error', w.state ->> 'error',
                    w.state ->> 'pause_reason'),
           left(w.payload::text, 200),
           w.created_at, w.updated_at
      FROM pepsi.messages AS w
     WHERE (dashboard_messages.in_status IS NULL OR w.status = dashboard_messages.in_status)
       AND (dashboard_messages.in_stage IS NULL OR w.stage = dashboard_messages.in_stage)
       AND (dashboard_messages.older_than IS NULL
            OR w.updated_at < now() - dashboard_messages.older_than)
       AND (dashboard_messages.match IS NULL OR w.payload @> dashboard_messages.match)
       AND (dashboard_messages.reason_group IS NULL
            OR (w.status IN ('failed', 'timeout', 'expired')
                AND pepsi._normalise_reason(coalesce(w.state ->> 'dispatch_error',
                                                     w.state ->> 'error', w.status))
                    = dashboard_messages.reason_group))
       AND (dashboard_messages.before_id IS NULL OR w.workqueue_id < dashboard_messages.before_id)
     ORDER BY w.workqueue_id DESC
     LIMIT least(greatest(coalesce(dashboard_messages.max_rows, 100), 1), 1000);
END
$$;
