-- pepsi.pause_stage(stage text, paused boolean) → boolean
--   Pause or resume a stage: `pepsi-queue pause STAGE` / `resume STAGE` and
--   the dashboard's Pause, Resume and Try now buttons, through the
--   configuration overlay.  paused = true sets pepsi.config
--   ('stage-' || stage, 'PAUSED', 'yes'); false deletes that row (section
--   and option compared without case, as the configuration does).  The
--   config trigger notifies 'config_changed', the dispatcher reloads and
--   claims nothing for a paused stage (running messages finish; its rows
--   stay where they are: pending, paused until due).  Returns true when the
--   overlay changed.
--   Resuming also sends NOTIFY config_changed, 'try_now:' || stage, whether
--   or not the stage was paused: each dispatcher ends that stage's hold-off
--   at once (a program that kept dying, fixed since, is started now rather
--   than at the end of a cooldown of up to 60 s).  A reload, which the
--   deleted row causes, ends every stage's hold-off anyway.
--   Pausing needs a stage of the stage registry (pepsi.stages, written by
--   the dispatcher from its configuration file plus overlay): any other
--   name raises 22023 and writes nothing.  Resuming takes any valid name, so
--   a leftover row of a stage the dispatcher has dropped can be removed.
--   An invalid name ([A-Za-z0-9_.-]+) raises 22023.
--   Writes: pepsi.config (one row).  Locks: that row.
--   Callers: pepsi_operator, pepsi_dispatcher, pepsi_dashboard (SECURITY DEFINER;
--   pepsi-queue pause/resume, pepsi-httpd's buttons).
CREATE OR REPLACE FUNCTION pepsi.pause_stage(stage text, paused boolean)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    IF pause_stage.stage IS NULL OR pause_stage.stage !~ '^[A-Za-z0-9_.-]+$' THEN
        RAISE EXCEPTION 'invalid stage name: %', pause_stage.stage
              USING ERRCODE = '22023';
    END IF;
    IF pause_stage.paused IS NULL THEN
        RAISE EXCEPTION 'pause_stage needs paused = true or false'
              USING ERRCODE = '22004';
    END IF;
    IF pause_stage.paused THEN
        IF NOT EXISTS (SELECT 1 FROM pepsi.stages AS s
                        WHERE s.stage = pause_stage.stage) THEN
            RAISE EXCEPTION 'unknown stage %: only stages the dispatcher serves can be paused',
                            pause_stage.stage
                  USING ERRCODE = '22023',
                        HINT = 'the stage registry (pepsi.registered_stages()) lists them';
        END IF;
        INSERT INTO pepsi.config AS c (section, option, value)
        VALUES ('stage-' || pause_stage.stage, 'PAUSED', 'yes')
        ON CONFLICT (section, option) DO UPDATE SET value = 'yes' WHERE c.value <> 'yes';
        GET DIAGNOSTICS n = ROW_COUNT;
    ELSE
        DELETE FROM pepsi.config AS c
         WHERE lower(c.section) = lower('stage-' || pause_stage.stage)
           AND upper(c.option) = 'PAUSED';
        GET DIAGNOSTICS n = ROW_COUNT;
        PERFORM pg_notify('config_changed', 'try_now:' || pause_stage.stage);
    END IF;
    RETURN n > 0;
END
$$;
