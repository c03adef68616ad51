-- Reverses migration 0018's history.v1.sql and history_trigger.v1.sql (its
-- downgrade), run after the functions of 0018 are gone.  The role is dropped unless another database of the cluster
-- still grants it something (then kept, as in drop.v1.sql).
DROP TRIGGER IF EXISTS workqueue_attempts ON pepsi.workqueue;
DROP TABLE IF EXISTS pepsi.attempts;
DROP TABLE IF EXISTS pepsi.tracebacks;
-- DROP OWNED takes the role's privileges in this database (it owns nothing).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pepsi_operator') THEN
        DROP OWNED BY pepsi_operator;
    END IF;
    DROP ROLE IF EXISTS pepsi_operator;
EXCEPTION WHEN dependent_objects_still_exist OR insufficient_privilege OR object_in_use THEN
    RAISE NOTICE 'role pepsi_operator kept: %', SQLERRM;
END
$$;
