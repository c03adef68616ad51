-- pepsi._reserved_state_keys() → text[]
--   The keys of workqueue.state that only the queue's own functions write,
--   listed once:
--     dispatch_error    the dispatcher's verdict (record_dispatch_error,
--                       requeue_due, check_answered)
--     delayed_until     marks a delayed message while it waits (enqueue and
--                       enqueue_many with a future not_before; requeue_due
--                       removes it): such a row is made pending without
--                       counting a retry and never expires, so a stage that
--                       could write it would opt its message out of
--                       MAX_RETRIES and EXPIRY
--     retry_error       the failure an automatic retry waits after
--                       (record_dispatch_error)
--     previous_error    the error a requeued message had (requeue_failed)
--     cancelled_status  the status a cancelled message had (cancel)
--     scheduled_for     the tick of a message a schedule enqueued
--                       (fire_schedule)
--     scheduled_by      the name of the schedule that enqueued it
--                       (fire_schedule)
--   pepsi.set_state refuses a patch with any of them (22023).
--   Reads/writes: nothing.
--   Callers: granted to nobody (set_state calls it).
CREATE OR REPLACE FUNCTION pepsi._reserved_state_keys()
RETURNS text[]
LANGUAGE sql IMMUTABLE
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
    SELECT ARRAY['dispatch_error', 'delayed_until', 'retry_error', 'previous_error',
                 'cancelled_status', 'scheduled_for', 'scheduled_by']::text[]
$$;
