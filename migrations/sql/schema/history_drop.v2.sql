-- Reverses migration 0018's history.v1.sql and history_trigger.v1.sql (its
-- downgrade), run after the functions of 0018 are gone.  The role's privileges
-- in this database always go (DROP OWNED: it owns nothing); the role itself is
-- dropped unless another database of the cluster still grants it something
-- (then kept, as in drop.v1.sql).  v1 ran DROP OWNED inside the block that
-- catches a failed DROP ROLE, so a kept role kept its grants on schema pepsi
-- here too.
DROP TRIGGER IF EXISTS workqueue_attempts ON pepsi.workqueue;
DROP TABLE IF EXISTS pepsi.attempts;
DROP TABLE IF EXISTS pepsi.tracebacks;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pepsi_operator') THEN
        DROP OWNED BY pepsi_operator;
    END IF;
END
$$;
DO $$
BEGIN
    DROP ROLE IF EXISTS pepsi_operator;
EXCEPTION WHEN dependent_objects_still_exist OR insufficient_privilege OR object_in_use THEN
    RAISE NOTICE 'role pepsi_operator kept: %', SQLERRM;
END
$$;
