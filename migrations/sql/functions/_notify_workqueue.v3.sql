-- pepsi._notify_workqueue() → trigger
--   Statement-level AFTER INSERT trigger on pepsi.workqueue (its new rows as
--   the transition table new_rows): one NOTIFY on channel 'workqueue' per
--   INSERT or COPY statement, however many rows it inserted.  Empty payload:
--   PostgreSQL folds identical notifications of one transaction into one,
--   which is what a wake-up hint wants.
--   Since migration 0041 it also refuses (23514, the whole statement) a row
--   whose payload is not a JSON object, when the inserting role is not the
--   table's owner: producers may insert stage, priority and payload
--   themselves (their COPY), and the table must refuse what pepsi.enqueue
--   refuses.  The queue's own functions run as the owner and check first, so
--   their inserts are not read again.  A statement trigger and not a CHECK:
--   a CHECK is evaluated again by every UPDATE of the row (the claim, the
--   finish), and reading a payload that is stored compressed or out of line
--   cost 7 us per row and update (17 kB payloads); this reads each new row
--   once, and only a producer's.
--   Since migration 0042 producers may insert dedupe_key too (a keyed COPY),
--   and it refuses (23514) a producer's key that pepsi.enqueue would refuse:
--   only whitespace, or longer than 512 bytes.  (A key a live message holds
--   is refused by workqueue_dedupe_idx itself: 23505.)
--   Reads: new_rows (producers' statements only).  Writes: nothing.
--   Locks: none.
--   Callers: granted to nobody (the INSERT trigger of pepsi.workqueue).
CREATE OR REPLACE FUNCTION pepsi._notify_workqueue()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    bad record;
BEGIN
    IF NOT pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class AS c WHERE c.oid = TG_RELID),
                       'USAGE') THEN
        -- One pass over the new rows, for both checks.
        SELECT n.workqueue_id AS id, jsonb_typeof(n.payload) AS kind,
               octet_length(n.dedupe_key) AS key_bytes
          INTO bad
          FROM new_rows AS n
         WHERE jsonb_typeof(n.payload) <> 'object'
            OR (n.dedupe_key IS NOT NULL
                AND (n.dedupe_key !~ '\S' OR octet_length(n.dedupe_key) > 512))
         LIMIT 1;
        IF FOUND AND bad.kind <> 'object' THEN
            RAISE EXCEPTION 'payload must be a JSON object, not a JSON % (message %)',
                            bad.kind, bad.id
                USING ERRCODE = '23514',
                      HINT = 'wrap the value in an object, e.g. {"value": ...}';
        ELSIF FOUND THEN
            RAISE EXCEPTION 'every dedupe key must be 1 to 512 bytes long and not only whitespace (message % has % bytes)',
                            bad.id, bad.key_bytes
                USING ERRCODE = '23514',
                      HINT = 'give that message a key of 1 to 512 bytes that is not only whitespace, or none';
        END IF;
    END IF;
    PERFORM pg_notify('workqueue', '');
    RETURN NULL;
END
$$;
