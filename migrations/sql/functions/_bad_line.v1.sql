-- pepsi._bad_line(line_number bigint, doc jsonb) → jsonb
--   Raises SQLSTATE 22023 (invalid_parameter_value): line line_number is
--   JSON but not an object (what, where, how to fix).  Never returns.
--   enqueue_lines calls it from its INSERT's select list for a line whose
--   jsonb_typeof is not 'object', so the one pass that parses the lines also
--   names the first bad one.
--   Reads/writes: nothing.  Locks: none.
--   Callers: granted to nobody (enqueue_lines calls it).
CREATE OR REPLACE FUNCTION pepsi._bad_line(line_number bigint, doc jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'line % must be a JSON object, not a JSON %', line_number, jsonb_typeof(doc)
        USING ERRCODE = '22023',
              DETAIL = format('line %s: %s', line_number, left(doc::text, 80)),
              HINT = 'wrap the value in an object, e.g. {"value": ...}; nothing of this call was enqueued';
END
$$;
