-- pepsi._check_payload(payload jsonb, what text) → void
--   Raises SQLSTATE 22023 (invalid_parameter_value) unless payload is NULL or
--   a JSON object.  what names the payload in the message ('payload',
--   'payload 3 of 10').  Every stage program reads its message as an object
--   (the SDK's msg.payload["key"]); 42 or [1,2] used to be accepted and then
--   failed in the worker.
--   Used by enqueue and enqueue_many (v2).
--   Reads/writes: nothing.  Locks: none.
--   Callers: granted to nobody (enqueue and enqueue_many call it).
CREATE OR REPLACE FUNCTION pepsi._check_payload(payload jsonb, what text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    IF payload IS NOT NULL AND jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION '% must be a JSON object, not a JSON %', what, jsonb_typeof(payload)
            USING ERRCODE = '22023',
                  HINT = 'wrap the value in an object, e.g. {"value": ...}';
    END IF;
END
$$;
