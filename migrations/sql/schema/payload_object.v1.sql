-- pepsi.workqueue refuses a producer's row whose payload is not a JSON
-- object (migration 0041), as pepsi.enqueue has since migration 0009:
-- producers may now COPY rows into the table's stage, priority and payload
-- columns (the bulk path of pepsi_dispatch.enqueue), and the table itself
-- must refuse what the functions refuse.  The stage name was already
-- checked by the CHECK workqueue_stage_name.  The payload is checked by the
-- insert trigger (_notify_workqueue v2), which now sees the statement's new
-- rows: a CHECK would be evaluated again by every update of every row, the
-- claim's and the finish's included.  Rows already in the table are not
-- checked (a message from before 0009 keeps its payload and still moves).
DROP TRIGGER workqueue_notify_insert ON pepsi.workqueue;
CREATE TRIGGER workqueue_notify_insert
    AFTER INSERT ON pepsi.workqueue
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pepsi._notify_workqueue();
