-- Reverses dashboard.v1.sql and the functions of migration 0010 (its
-- downgrade).  The role is dropped unless another database of the cluster
-- still grants it something (then kept, as in drop.v1.sql).
DROP FUNCTION IF EXISTS pepsi.dashboard_snapshot(interval);
DROP FUNCTION IF EXISTS pepsi.dashboard_failed(text, text, integer);
DROP FUNCTION IF EXISTS pepsi.dashboard_message(bigint);
DROP FUNCTION IF EXISTS pepsi.dashboard_requeue(bigint[]);
DROP FUNCTION IF EXISTS pepsi.dashboard_cancel(bigint[]);
DROP FUNCTION IF EXISTS pepsi.dashboard_pause_stage(text, boolean);
ALTER TABLE pepsi.dispatchers DROP COLUMN IF EXISTS gauges;
REVOKE USAGE ON SCHEMA pepsi FROM pepsi_dashboard;
DO $$
BEGIN
    DROP ROLE IF EXISTS pepsi_dashboard;
EXCEPTION WHEN dependent_objects_still_exist OR insufficient_privilege OR object_in_use THEN
    RAISE NOTICE 'role pepsi_dashboard kept: %', SQLERRM;
END
$$;
