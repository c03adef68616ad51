-- pepsi._notify_config() → trigger
--   Statement-level trigger on pepsi.config (INSERT, UPDATE, DELETE,
--   TRUNCATE): NOTIFY 'config_changed' with the operation as payload.
--   The dispatcher re-reads the whole overlay; the payload is informative.
--   Reads/writes: nothing.  Locks: none.
--   Callers: granted to nobody (the statement trigger of pepsi.config).
CREATE OR REPLACE FUNCTION pepsi._notify_config()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify('config_changed', lower(TG_OP));
    RETURN NULL;
END
$$;
