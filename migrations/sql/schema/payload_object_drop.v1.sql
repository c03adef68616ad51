-- Undoes payload_object.v1.sql (the downgrade of migration 0041): the insert
-- trigger without its transition table, as triggers.v1.sql made it (run
-- after _notify_workqueue v1 is back).
DROP TRIGGER workqueue_notify_insert ON pepsi.workqueue;
CREATE TRIGGER workqueue_notify_insert
    AFTER INSERT ON pepsi.workqueue
    FOR EACH STATEMENT EXECUTE FUNCTION pepsi._notify_workqueue();
