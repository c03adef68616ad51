-- pepsi._check_stage(stage text) → void
--   Raises SQLSTATE 22023 (invalid_parameter_value) unless stage is a valid
--   stage name: non-null and matching ^[A-Za-z0-9_.-]+$ (the worker
--   contract's STAGE_NAME_RE, pepsi_dispatch/contract.py).
--   Used by enqueue, enqueue_many and advance so a bad name fails with a
--   clear message instead of a CHECK violation.
--   Reads/writes: nothing.  Locks: none.
--   Callers: granted to nobody (enqueue, enqueue_many and advance call it).
CREATE OR REPLACE FUNCTION pepsi._check_stage(stage text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    IF stage IS NULL OR stage !~ '^[A-Za-z0-9_.-]+$' THEN
        RAISE EXCEPTION 'invalid stage name %', coalesce(quote_literal(stage), 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'stage names match [A-Za-z0-9_.-]+';
    END IF;
END
$$;
