-- Removes everything migration 0001 created: the schema (tables, functions,
-- triggers, types and every grant on them go with it), then the roles.
-- A role still referenced by another database of the cluster (another pepsi
-- database, a test database) cannot be dropped there; that is expected and
-- ignored, as is a migrating user without CREATEROLE.
DROP SCHEMA IF EXISTS pepsi CASCADE;
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['pepsi_dispatcher', 'pepsi_stage', 'pepsi_ingress'] LOOP
        BEGIN
            EXECUTE format('DROP ROLE IF EXISTS %I', r);
        EXCEPTION WHEN dependent_objects_still_exist OR insufficient_privilege
                       OR object_in_use THEN
            RAISE NOTICE 'role % kept: %', r, SQLERRM;
        END;
    END LOOP;
END
$$;
