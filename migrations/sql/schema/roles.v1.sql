-- Roles of pepsi-dispatch (cluster-global, NOLOGIN group roles).
--   pepsi_dispatcher  the coordinator: claim, requeue, release, stats; reads the tables
--   pepsi_stage       stage programs: transitions, get_message(s), set_state, enqueue
--   pepsi_ingress     producers: enqueue, enqueue_many
-- Roles are shared by every database of the cluster, so they are created only
-- when missing; two migrations running at once on the same cluster may race,
-- hence the duplicate handlers.  Login roles are granted membership by a DBA.
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['pepsi_dispatcher', 'pepsi_stage', 'pepsi_ingress'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- created concurrently by another database's migration
            END;
        END IF;
    END LOOP;
END
$$;
