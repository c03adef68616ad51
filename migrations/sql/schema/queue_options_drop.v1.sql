-- Undo queue_options.v1.sql (migration 0019's downgrade): the schedules'
-- table, the dedupe index, the claim index back to (stage, workqueue_id),
-- the two columns.  Priorities and keys of existing rows are lost.
DROP TABLE pepsi.schedule_ticks;
DROP INDEX pepsi.workqueue_dedupe_idx;
DROP INDEX pepsi.workqueue_pending_idx;
CREATE INDEX workqueue_pending_idx ON pepsi.workqueue (stage, workqueue_id)
    WHERE status = 'pending';
ALTER TABLE pepsi.workqueue
    DROP COLUMN dedupe_key,
    DROP COLUMN priority;
