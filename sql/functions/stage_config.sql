-- pepsi.stage_config() → table(section text, option text, value text)
--   The [stage-*] and [schedule-*] rows of the configuration overlay
--   (pepsi.config): the dispatcher merges them into its file (stages and
--   schedules); the worker SDK into the file's graph, so it checks advances
--   against the same NEXT lists as the dispatcher.
--   Reads: pepsi.config.  Locks: none.
--   Callers: pepsi_stage, pepsi_dispatcher (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.stage_config()
RETURNS TABLE (section text, option text, value text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT c.section, c.option, c.value
      FROM pepsi.config AS c
     WHERE lower(c.section) LIKE 'stage-%' OR lower(c.section) LIKE 'schedule-%'
     ORDER BY c.section, c.option;
END
$$;
