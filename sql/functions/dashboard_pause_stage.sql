-- pepsi.dashboard_pause_stage(stage text, paused boolean) → boolean
--   The dashboard's "pause"/"resume" buttons, through the configuration
--   overlay: paused = true sets pepsi.config ('stage-' || stage, 'PAUSED',
--   'yes'); false deletes that row (section and option compared without
--   case, as the configuration does).  The config trigger notifies
--   'config_changed', the dispatcher reloads and claims nothing for a paused
--   stage (running messages finish; rows stay pending).  Returns true when
--   the overlay changed.
--   Pausing needs a stage of the stage registry (pepsi.stages, written by
--   the dispatcher from its configuration file plus overlay): any other
--   name raises 22023 and writes nothing.  Resuming takes any valid name, so
--   a leftover row of a stage the dispatcher has dropped can be removed.
--   An invalid name ([A-Za-z0-9_.-]+) raises 22023.
--   Writes: pepsi.config (one row).  Locks: that row.
--   Callers: pepsi_dashboard (SECURITY DEFINER).
--
-- Why v2: v1 took any well-formed name.  A PAUSED row for a stage the
--   configuration does not define is a section without a PROGRAM: the next
--   reload did not parse and the dispatcher exited 1, and every restart
--   exited 2 while the row stayed -- a dashboard login (or the Pause button
--   of a pepsi-httpd whose configuration still listed a dropped stage) could
--   stop the dispatcher for good.
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
        IF NOT EXISTS (SELECT 1 FROM pepsi.stages AS s
                        WHERE s.stage = dashboard_pause_stage.stage) THEN
            RAISE EXCEPTION 'unknown stage %: only stages the dispatcher serves can be paused',
                            dashboard_pause_stage.stage
                  USING ERRCODE = '22023',
                        HINT = 'the stage registry (pepsi.registered_stages()) lists them';
        END IF;
        INSERT INTO pepsi.config AS c (section, option, value)
        VALUES ('stage-' || dashboard_pause_stage.stage, 'PAUSED', 'yes')
        ON CONFLICT (section, option) DO UPDATE SET value = 'yes' WHERE c.value <> 'yes';
    ELSE
        DELETE FROM pepsi.config AS c
         WHERE lower(c.section) = lower('stage-' || dashboard_pause_stage.stage)
           AND upper(c.option) = 'PAUSED';
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n > 0;
END
$$;
