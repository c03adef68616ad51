-- pepsi.schema_version() → text
--   The alembic revision the database is at (public.alembic_version), NULL
--   when the table is missing or empty.  `pepsi-dispatch serve --check`,
--   `serve` and `pepsi-queue migrate --current` read it through this
--   function, so a role that may not read the table itself (the
--   dispatcher's, an operator's) gets the same answer as the role that
--   migrated.
--   Reads: public.alembic_version.  Locks: none.
--   Callers: pepsi_dispatcher, pepsi_operator, pepsi_dashboard, pepsi_stage, pepsi_ingress
--   (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.schema_version()
RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    v text;
BEGIN
    IF to_regclass('public.alembic_version') IS NULL THEN
        RETURN NULL;
    END IF;
    EXECUTE 'SELECT string_agg(version_num, '','' ORDER BY version_num) FROM public.alembic_version'
       INTO v;
    RETURN v;
END
$$;
