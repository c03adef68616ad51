-- pepsi.workqueue refuses a payload that is not a JSON object (migration
-- 0041), as pepsi.enqueue always has: producers may now COPY rows into the
-- table's stage, payload and priority columns (the bulk path of
-- pepsi_dispatch.enqueue), and the table itself must refuse what the
-- functions refuse.  The stage name was already checked by
-- workqueue_stage_name.  Adding it reads the whole table once under the
-- migration's lock (the queue's live rows; kept failures live in
-- pepsi.dead_letters).
ALTER TABLE pepsi.workqueue
    ADD CONSTRAINT workqueue_payload_object CHECK (jsonb_typeof(payload) = 'object');
