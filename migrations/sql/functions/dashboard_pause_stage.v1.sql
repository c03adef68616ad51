-- pepsi.dashboard_pause_stage(stage text, paused boolean) → boolean
--   The dashboard's "pause"/"resume" buttons, through the configuration
--   overlay: paused = true sets pepsi.config ('stage-' || stage, 'PAUSED',
--   'yes'); false deletes that row.  The config trigger notifies
--   'config_changed', the dispatcher reloads and claims nothing for a paused
--   stage (running messages finish; rows stay pending).  Returns true when
--   the overlay changed.  The stage name must be a valid one
--   ([A-Za-z0-9_.-]+, SQLSTATE 22023 otherwise); whether the configuration
--   knows it is the caller's check (pepsi-httpd offers configured stages only).
--   Writes: pepsi.config (one row).  Locks: that row.
--   Callers: pepsi_dashboard (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.dashboard_pause_stage(stage text, paused boolean)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    IF dashboard_pause_stage.stage IS NULL OR dashboard_pause_stage.stage !~ '^[A-Za-z0-9_.-]+$' THEN
        RAISE EXCEPTION 'invalid stage name: %', dashboard_pause_stage.stage
              USING ERRCODE = '22023';
    END IF;
    IF dashboard_pause_stage.paused THEN
        INSERT INTO pepsi.config AS c (section, option, value)
        VALUES ('stage-' || dashboard_pause_stage.stage, 'PAUSED', 'yes')
        ON CONFLICT (section, option) DO UPDATE SET value = 'yes' WHERE c.value <> 'yes';
    ELSE
        DELETE FROM pepsi.config AS c
         WHERE c.section = 'stage-' || dashboard_pause_stage.stage AND c.option = 'PAUSED';
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n > 0;
END
$$;
