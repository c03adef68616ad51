-- pepsi.set_state(id bigint, from_stage text, patch jsonb,
--                 dispatcher_id bigint default null) → boolean
--   Merges patch (a JSON object) into state of a running message (top-level
--   keys of patch replace those of state).  Applies only when the row is
--   'running' at from_stage (and held by dispatcher_id when given);
--   otherwise changes nothing and returns false.
--   Raises 22023 when patch is NULL, not an object, or contains a key the
--   queue reserves (pepsi._reserved_state_keys(): dispatch_error,
--   delayed_until, retry_error, previous_error, cancelled_status,
--   scheduled_for), naming
--   the keys; nothing is written then.
--   Writes: pepsi.workqueue (one row).  Locks: that row.
--   Callers: pepsi_stage (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.set_state(id bigint, from_stage text, patch jsonb,
                                           dispatcher_id bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
DECLARE
    reserved text[];
BEGIN
    IF set_state.patch IS NULL OR jsonb_typeof(set_state.patch) <> 'object' THEN
        RAISE EXCEPTION 'state patch must be a JSON object'
            USING ERRCODE = '22023';
    END IF;
    IF set_state.patch ?| pepsi._reserved_state_keys() THEN
        SELECT array_agg(k ORDER BY k) INTO reserved
          FROM unnest(pepsi._reserved_state_keys()) AS k
         WHERE set_state.patch ? k;
        RAISE EXCEPTION 'reserved state keys in patch: % (only the queue writes them)',
                        array_to_string(reserved, ', ')
            USING ERRCODE = '22023',
                  HINT = 'reserved state keys: '
                         || array_to_string(pepsi._reserved_state_keys(), ', ');
    END IF;
    UPDATE pepsi.workqueue AS w
       SET state = w.state || set_state.patch, updated_at = now()
     WHERE w.workqueue_id = set_state.id
       AND w.stage = set_state.from_stage
       AND (w.status = 'running') IS TRUE  -- not the partial index: see v2's header
       AND (set_state.dispatcher_id IS NULL OR w.dispatcher_id = set_state.dispatcher_id);
    RETURN FOUND;
END
$$;
