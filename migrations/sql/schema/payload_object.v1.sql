-- pepsi.workqueue refuses a payload that is not a JSON object (migration
-- 0041), as pepsi.enqueue has since migration 0009: producers may now COPY
-- rows into the table's stage, payload and priority columns (the bulk path
-- of pepsi_dispatch.enqueue), and the table itself must refuse what the
-- functions refuse.  The stage name was already checked by
-- workqueue_stage_name.
--
-- A message enqueued before 0009 may still carry another JSON value.  The
-- constraint would refuse every later change of such a row (a claim, a
-- requeue from pepsi.dead_letters), so the upgrade stops first, naming how
-- many there are and how to deal with them.  Adding the constraint reads
-- the whole table once under the migration's lock.
DO $$
DECLARE
    live bigint;
    kept bigint;
BEGIN
    SELECT count(*) INTO live FROM pepsi.workqueue WHERE jsonb_typeof(payload) <> 'object';
    SELECT count(*) INTO kept FROM pepsi.dead_letters WHERE jsonb_typeof(payload) <> 'object';
    IF live + kept > 0 THEN
        RAISE EXCEPTION 'migration 0041: % message(s) in pepsi.workqueue and % in pepsi.dead_letters carry a payload that is not a JSON object (enqueued before migration 0009)',
                        live, kept
            USING ERRCODE = '23514',
                  HINT = 'as the schema owner, wrap each such payload in an object '
                         '(UPDATE pepsi.workqueue SET payload = jsonb_build_object(''value'', payload) '
                         'WHERE jsonb_typeof(payload) <> ''object''; the same for pepsi.dead_letters) '
                         'or delete those rows (done ones too: every row of the table is checked); '
                         'then upgrade again';
    END IF;
END
$$;
ALTER TABLE pepsi.workqueue
    ADD CONSTRAINT workqueue_payload_object CHECK (jsonb_typeof(payload) = 'object');
