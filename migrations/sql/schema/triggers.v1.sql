-- Notifications (hints; the dispatcher's poll is the source of truth).
-- Statement-level, so a bulk insert of 10,000 rows is one NOTIFY, not 10,000.
CREATE TRIGGER workqueue_notify_insert
    AFTER INSERT ON pepsi.workqueue
    FOR EACH STATEMENT EXECUTE FUNCTION pepsi._notify_workqueue();

CREATE TRIGGER config_notify_change
    AFTER INSERT OR UPDATE OR DELETE ON pepsi.config
    FOR EACH STATEMENT EXECUTE FUNCTION pepsi._notify_config();
CREATE TRIGGER config_notify_truncate
    AFTER TRUNCATE ON pepsi.config
    FOR EACH STATEMENT EXECUTE FUNCTION pepsi._notify_config();
