-- Dashboard and metrics support (migration 0010): the pepsi_dashboard role and
-- the column the dispatcher's in-memory gauges land in.
--
--   pepsi_dashboard  NOLOGIN group role of pepsi-httpd: no table privileges at
--                    all; it reads through the SECURITY DEFINER dashboard_*
--                    functions and acts (requeue, cancel, pause a stage) only
--                    through dashboard_requeue, dashboard_cancel and
--                    dashboard_pause_stage.  A DBA gives a login role
--                    membership:  CREATE ROLE pepsi_web LOGIN PASSWORD '…'
--                    IN ROLE pepsi_dashboard;
--   dispatchers.gauges  the last gauges a dispatcher sent with its heartbeat
--                    (pepsi.heartbeat v3): workers by state, in-flight ids,
--                    round trips, histograms.  NULL until the first one.
-- Roles are cluster-global: created only when missing (see roles.v1.sql).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pepsi_dashboard') THEN
        BEGIN
            CREATE ROLE pepsi_dashboard NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- created concurrently by another database's migration
        END;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA pepsi TO pepsi_dashboard;

ALTER TABLE pepsi.dispatchers ADD COLUMN gauges jsonb;
