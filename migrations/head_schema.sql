CREATE SCHEMA pepsi;

COMMENT ON SCHEMA pepsi IS 'pepsi-dispatch work queue (tables are private; use the functions)';

CREATE FUNCTION pepsi._bad_line(line_number bigint, doc jsonb) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RAISE EXCEPTION 'line % must be a JSON object, not a JSON %', line_number, jsonb_typeof(doc)
        USING ERRCODE = '22023',
              DETAIL = format('line %s: %s', line_number, left(doc::text, 80)),
              HINT = 'wrap the value in an object, e.g. {"value": ...}; nothing of this call was enqueued';
END
$$;

CREATE FUNCTION pepsi._check_payload(payload jsonb, what text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF payload IS NOT NULL AND jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION '% must be a JSON object, not a JSON %', what, jsonb_typeof(payload)
            USING ERRCODE = '22023',
                  HINT = 'wrap the value in an object, e.g. {"value": ...}';
    END IF;
END
$$;

CREATE FUNCTION pepsi._check_stage(stage text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $_$
BEGIN
    IF stage IS NULL OR stage !~ '^[A-Za-z0-9_.-]+$' THEN
        RAISE EXCEPTION 'invalid stage name %', coalesce(quote_literal(stage), 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'stage names match [A-Za-z0-9_.-]+';
    END IF;
END
$_$;

CREATE FUNCTION pepsi._dispatcher_hold(dispatcher_id bigint) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF _dispatcher_hold.dispatcher_id IS NULL THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT 1
                 FROM pg_catalog.pg_locks AS l
                WHERE l.pid = pg_backend_pid() AND l.locktype = 'advisory' AND l.granted
                  AND l.classid = 1885629558::oid
                  AND l.objid = (_dispatcher_hold.dispatcher_id & 2147483647)::oid
                  AND l.objsubid = 2) THEN
        RETURN true;
    END IF;
    RETURN pg_try_advisory_lock(1885629558,
                                (_dispatcher_hold.dispatcher_id & 2147483647)::integer);
END
$$;

CREATE FUNCTION pepsi._dispatcher_live(dispatcher_id bigint) RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $_$
    SELECT EXISTS (
        SELECT 1
          FROM pg_catalog.pg_locks AS l
         WHERE l.locktype = 'advisory' AND l.granted
           AND l.database = (SELECT b.oid FROM pg_catalog.pg_database AS b
                              WHERE b.datname = current_database())
           AND l.classid = 1885629558::oid
           AND l.objid = ($1 & 2147483647)::oid
           AND l.objsubid = 2)
$_$;

CREATE FUNCTION pepsi._list_messages_sql(statuses text[], in_stage text, older_than interval, payload_contains jsonb, before_id bigint, max_rows integer, reason_group text DEFAULT NULL::text, paused_stages text[] DEFAULT NULL::text[]) RETURNS text
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    q text;
    filter text;
BEGIN
    -- The filter first: an unknown status is refused before max_rows is checked.
    filter := pepsi._list_messages_where(
        _list_messages_sql.statuses, _list_messages_sql.in_stage, _list_messages_sql.older_than,
        _list_messages_sql.payload_contains, _list_messages_sql.reason_group,
        _list_messages_sql.before_id);
    IF _list_messages_sql.max_rows IS NULL
       OR _list_messages_sql.max_rows NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'list_messages: max_rows must be 1 … 10000, not %',
            coalesce(_list_messages_sql.max_rows::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    q := 'SELECT w.workqueue_id, w.stage, w.status,'
      || ' CASE WHEN w.status = ''paused'' AND w.state ? ''delayed_until'' THEN ''delayed'''
      || ' WHEN w.status = ''paused'' THEN ''retry wait'''
      || format(' WHEN w.status = ''pending'' AND w.stage = ANY (%L::text[])',
                coalesce(_list_messages_sql.paused_stages, '{}'))
      || ' THEN ''stage paused'''
      || ' WHEN w.status = ''failed'' AND w.state ? ''cancelled_status'' THEN ''cancelled'''
      || ' ELSE w.status END,'
      || ' w.retries, w.created_at, w.updated_at,'
      || ' CASE WHEN w.status = ''paused'' THEN w.timeout END,'
      || ' coalesce(w.state ->> ''dispatch_error'', w.state ->> ''error'','
      || ' CASE WHEN w.status = ''paused'' THEN w.state ->> ''pause_reason'' END),'
      || ' w.payload FROM pepsi.messages AS w WHERE true';
    RETURN q || filter || format(' ORDER BY w.workqueue_id DESC LIMIT %s', _list_messages_sql.max_rows);
END
$$;

CREATE FUNCTION pepsi._list_messages_where(statuses text[], in_stage text, older_than interval, payload_contains jsonb, reason_group text, before_id bigint) RETURNS text
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    q text := '';
    bad text;
BEGIN
    SELECT s INTO bad FROM unnest(_list_messages_where.statuses) AS s
     WHERE s IS NULL OR s NOT IN ('pending', 'running', 'paused', 'done', 'failed',
                                  'timeout', 'expired')
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'list_messages: unknown status %', coalesce(quote_literal(bad), 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'pending, running, paused, done, failed, timeout or expired';
    END IF;
    IF cardinality(_list_messages_where.statuses) = 1 THEN
        q := q || format(' AND w.status = %L', _list_messages_where.statuses[1]);
    ELSIF cardinality(_list_messages_where.statuses) > 1 THEN
        q := q || format(' AND w.status IN (%s)',
                         (SELECT string_agg(DISTINCT quote_literal(s), ', ')
                            FROM unnest(_list_messages_where.statuses) AS s));
    END IF;
    IF _list_messages_where.in_stage IS NOT NULL THEN
        q := q || format(' AND w.stage = %L', _list_messages_where.in_stage);
    END IF;
    IF _list_messages_where.older_than IS NOT NULL THEN
        q := q || format(' AND w.updated_at < now() - %L::interval',
                         _list_messages_where.older_than);
    END IF;
    IF _list_messages_where.payload_contains IS NOT NULL THEN
        q := q || format(' AND w.payload @> %L::jsonb', _list_messages_where.payload_contains);
    END IF;
    IF _list_messages_where.reason_group IS NOT NULL THEN
        q := q || ' AND w.status IN (''failed'', ''timeout'', ''expired'')'
               || format(' AND pepsi._normalise_reason(coalesce(w.state ->> ''dispatch_error'','
                         ' w.state ->> ''error'', w.status)) = %L',
                         _list_messages_where.reason_group);
    END IF;
    IF _list_messages_where.before_id IS NOT NULL THEN
        q := q || format(' AND w.workqueue_id < %s', _list_messages_where.before_id);
    END IF;
    RETURN q;
END
$$;

CREATE FUNCTION pepsi._live_stats() RETURNS TABLE(stage text, processed bigint, failed bigint, timeouts bigint, crashes bigint, processing_seconds double precision)
    LANGUAGE sql STABLE
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
    WITH unflushed AS (
        SELECT u.key AS stage,
               sum(coalesce((u.value ->> 'processed')::bigint, 0)) AS processed,
               sum(coalesce((u.value ->> 'failed')::bigint, 0)) AS failed,
               sum(coalesce((u.value ->> 'timeouts')::bigint, 0)) AS timeouts,
               sum(coalesce((u.value ->> 'crashes')::bigint, 0)) AS crashes,
               sum(coalesce((u.value ->> 'seconds')::float8, 0)) AS seconds
          FROM pepsi.dispatchers AS d
         CROSS JOIN LATERAL jsonb_each(
                   CASE WHEN jsonb_typeof(d.gauges -> 'unflushed' -> 'stages') = 'object'
                        THEN d.gauges -> 'unflushed' -> 'stages' ELSE '{}' END) AS u
         WHERE jsonb_typeof(u.value) = 'object'
           AND pepsi._dispatcher_live(d.dispatcher_id)
         GROUP BY u.key
    )
    SELECT coalesce(s.stage, u.stage),
           (coalesce(s.processed, 0) + coalesce(u.processed, 0))::bigint,
           (coalesce(s.failed, 0) + coalesce(u.failed, 0))::bigint,
           (coalesce(s.timeouts, 0) + coalesce(u.timeouts, 0))::bigint,
           (coalesce(s.crashes, 0) + coalesce(u.crashes, 0))::bigint,
           coalesce(s.processing_seconds, 0) + coalesce(u.seconds, 0)
      FROM pepsi.stage_stats AS s
      FULL JOIN unflushed AS u ON u.stage = s.stage
$$;

CREATE FUNCTION pepsi._matching_ids(verb text, acts_on text[], statuses text[], in_stage text, older_than interval, payload_contains jsonb, reason_group text, before_id bigint) RETURNS bigint[]
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    wanted text[] := _matching_ids.acts_on;
    ids bigint[];
BEGIN
    IF _matching_ids.statuses IS NOT NULL THEN
        -- An unknown status is refused as list_messages refuses it.
        PERFORM pepsi._list_messages_where(_matching_ids.statuses, NULL, NULL, NULL, NULL, NULL);
        SELECT coalesce(array_agg(DISTINCT s), '{}') INTO wanted
          FROM unnest(_matching_ids.statuses) AS s
         WHERE s = ANY (_matching_ids.acts_on);
        IF cardinality(wanted) = 0 THEN
            RAISE EXCEPTION '% acts on % messages only, not on %', _matching_ids.verb,
                regexp_replace(array_to_string(_matching_ids.acts_on, ', '),
                               ', ([^,]*)$', ' or \1'),
                array_to_string(_matching_ids.statuses, ', ')
                USING ERRCODE = '22023';
        END IF;
    END IF;
    EXECUTE 'SELECT coalesce(array_agg(w.workqueue_id ORDER BY w.workqueue_id), ''{}'')'
         || ' FROM pepsi.messages AS w WHERE true'
         || pepsi._list_messages_where(wanted, _matching_ids.in_stage, _matching_ids.older_than,
                                       _matching_ids.payload_contains, _matching_ids.reason_group,
                                       _matching_ids.before_id)
       INTO ids;
    RETURN ids;
END
$_$;

CREATE FUNCTION pepsi._normalise_reason(reason text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
    SELECT btrim(regexp_replace(
             regexp_replace(
               regexp_replace(
                 regexp_replace(
                   regexp_replace(
                     regexp_replace(reason, '^\s*-?[0-9]+\s+', ''),
                     '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<uuid>', 'gi'),
                   '\m0x[0-9a-f]+\M', '<hex>', 'gi'),
                 '\m(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{6,}\M', '<hex>', 'gi'),
               '(^|[^0-9A-Za-z_])-?[0-9]+(\.[0-9]+)?', '\1<n>', 'g'),
             '\s+', ' ', 'g'))
$$;

CREATE FUNCTION pepsi._notify_config() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pg_notify('config_changed', lower(TG_OP));
    RETURN NULL;
END
$$;

CREATE FUNCTION pepsi._notify_workqueue() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
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

CREATE FUNCTION pepsi._record_attempt() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    outcome text;
    why text;
    tb text;
    began timestamptz;
    n integer;
BEGIN
    IF OLD.status = 'running' THEN
        began := OLD.updated_at;
        IF NEW.status = 'pending' THEN
            outcome := 'released';
        ELSIF NEW.status = 'timeout' THEN
            outcome := 'timeout';
            why := NEW.state ->> 'dispatch_error';
        ELSIF NEW.status = 'paused' THEN
            IF (NEW.state ->> 'pause_reason') LIKE 'automatic retry %'
               AND (NEW.state -> 'pause_reason') IS DISTINCT FROM (OLD.state -> 'pause_reason') THEN
                why := NEW.state ->> 'retry_error';
                outcome := CASE WHEN why ~ '^worker (exited|killed)' THEN 'crash'
                                WHEN why ~* '^(timeout|timed out)|MAX_RUNTIME' THEN 'timeout'
                                ELSE 'failed' END;
            ELSE
                outcome := 'paused';
                why := NEW.state ->> 'pause_reason';
                IF why LIKE 'automatic retry %' THEN
                    why := NULL;  -- an earlier retry's note: this pause gave no reason
                END IF;
            END IF;
        ELSIF (NEW.state -> 'dispatch_error') IS DISTINCT FROM (OLD.state -> 'dispatch_error') THEN
            why := NEW.state ->> 'dispatch_error';
            outcome := CASE WHEN why ~ '^worker (exited|killed)' THEN 'crash' ELSE 'failed' END;
        ELSE
            outcome := 'failed';
            why := coalesce(NEW.state ->> 'error', NEW.state ->> 'dispatch_error');
        END IF;
        DELETE FROM pepsi.tracebacks AS t WHERE t.workqueue_id = NEW.workqueue_id
        RETURNING t.traceback INTO tb;
    ELSIF NEW.status = 'expired' THEN
        outcome := 'expired';
        why := 'expired';
    ELSIF NEW.status = 'failed' AND (NEW.state ->> 'error') LIKE 'cancelled%'
          AND (NEW.state -> 'error') IS DISTINCT FROM (OLD.state -> 'error') THEN
        outcome := 'cancelled';
        why := NEW.state ->> 'error';
    ELSE
        outcome := 'failed';
        why := coalesce(NEW.state ->> 'dispatch_error', NEW.state ->> 'error', NEW.status);
    END IF;
    SELECT coalesce(max(a.attempt), 0) + 1 INTO n
      FROM pepsi.attempts AS a WHERE a.workqueue_id = NEW.workqueue_id;
    INSERT INTO pepsi.attempts (workqueue_id, attempt, stage, started_at, ended_at,
                                outcome, reason, traceback)
    VALUES (NEW.workqueue_id, n, OLD.stage, began, now(), outcome, left(why, 2000), tb);
    IF n > 20 THEN
        DELETE FROM pepsi.attempts AS a
         WHERE a.workqueue_id = NEW.workqueue_id AND a.attempt <= n - 20;
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION pepsi._reserved_state_keys() RETURNS text[]
    LANGUAGE sql IMMUTABLE
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
    SELECT ARRAY['dispatch_error', 'delayed_until', 'retry_error', 'previous_error',
                 'cancelled_status', 'scheduled_for', 'scheduled_by']::text[]
$$;

CREATE FUNCTION pepsi._retry_cap(stage text, stages text[], max_retries integer[], default_max_retries integer) RETURNS integer
    LANGUAGE sql STABLE
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
    SELECT CASE
        WHEN _retry_cap.stages IS NULL THEN
            coalesce((SELECT s.max_retries FROM pepsi.stages AS s WHERE s.stage = _retry_cap.stage),
                     _retry_cap.default_max_retries, 10)
        ELSE
            coalesce((SELECT m.cap FROM unnest(_retry_cap.stages, _retry_cap.max_retries)
                                         AS m(stage, cap)
                       WHERE m.stage = _retry_cap.stage LIMIT 1),
                     _retry_cap.default_max_retries)
    END
$$;

CREATE FUNCTION pepsi.advance(id bigint, from_stage text, to_stage text, dispatcher_id bigint DEFAULT NULL::bigint) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pepsi._check_stage(advance.to_stage);
    UPDATE pepsi.workqueue AS w
       SET stage = advance.to_stage, status = 'pending', retries = 0,
           timeout = NULL, dispatcher_id = NULL, updated_at = now()
     WHERE w.workqueue_id = advance.id
       AND w.stage = advance.from_stage
       AND (w.status = 'running') IS TRUE  -- not the partial index: see header
       AND (advance.dispatcher_id IS NULL OR w.dispatcher_id = advance.dispatcher_id);
    RETURN FOUND;
END
$$;

CREATE FUNCTION pepsi.advance_many(ids bigint[], from_stage text, to_stage text, dispatcher_id bigint DEFAULT NULL::bigint) RETURNS SETOF bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
BEGIN
    PERFORM pepsi._check_stage(advance_many.to_stage);
    RETURN QUERY
    UPDATE pepsi.workqueue AS w
       SET stage = advance_many.to_stage, status = 'pending', retries = 0,
           timeout = NULL, dispatcher_id = NULL, updated_at = now()
     WHERE w.workqueue_id = ANY (advance_many.ids)
       AND w.stage = advance_many.from_stage
       AND (w.status = 'running') IS TRUE  -- not the partial index: see header
       AND (advance_many.dispatcher_id IS NULL OR w.dispatcher_id = advance_many.dispatcher_id)
    RETURNING w.workqueue_id;
END
$$;

CREATE FUNCTION pepsi.cancel(ids bigint[] DEFAULT NULL::bigint[], stage text DEFAULT NULL::text, all_rows boolean DEFAULT false) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n integer;
BEGIN
    IF coalesce(cancel.all_rows, false) THEN
        IF cancel.ids IS NOT NULL OR cancel.stage IS NOT NULL THEN
            RAISE EXCEPTION 'cancel: all_rows cannot be combined with ids or stage'
                USING ERRCODE = '22023';
        END IF;
    ELSIF cancel.ids IS NULL AND cancel.stage IS NULL THEN
        RAISE EXCEPTION 'cancel: say which messages (ids, stage, or all_rows => true)'
            USING ERRCODE = '22023';
    END IF;
    UPDATE pepsi.workqueue AS w
       SET status = 'failed', timeout = NULL, updated_at = now(),
           state = (w.state - 'delayed_until')
                   || jsonb_build_object('error', 'cancelled by operator',
                                         'cancelled_status', w.status)
     WHERE w.status IN ('pending', 'paused')
       AND (cancel.ids IS NULL OR w.workqueue_id = ANY (cancel.ids))
       AND (cancel.stage IS NULL OR w.stage = cancel.stage);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

CREATE FUNCTION pepsi.cancel_matching(statuses text[] DEFAULT NULL::text[], in_stage text DEFAULT NULL::text, older_than interval DEFAULT NULL::interval, payload_contains jsonb DEFAULT NULL::jsonb, before_id bigint DEFAULT NULL::bigint, dry_run boolean DEFAULT false) RETURNS TABLE(matched integer, acted integer, newest_id bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    ids bigint[];
BEGIN
    ids := pepsi._matching_ids('cancel', ARRAY['pending', 'paused'],
                               cancel_matching.statuses, cancel_matching.in_stage,
                               cancel_matching.older_than, cancel_matching.payload_contains,
                               NULL, cancel_matching.before_id);
    matched := cardinality(ids);
    newest_id := ids[matched];
    acted := 0;
    IF matched > 0 AND NOT coalesce(cancel_matching.dry_run, false) THEN
        acted := pepsi.cancel(ids => ids);
    END IF;
    RETURN NEXT;
END
$$;

CREATE FUNCTION pepsi.check_answered(dispatcher_id bigint, ids bigint[]) RETURNS TABLE(workqueue_id bigint, stage text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
DECLARE
    bare bigint[] := '{}';  -- rows whose state stays as it is
    r record;
    out_ids bigint[];
    out_stages text[];
BEGIN
    FOR pass IN 1..2 LOOP
        BEGIN
            WITH moved AS (
                UPDATE pepsi.workqueue AS w
                   SET status = 'failed', dispatcher_id = NULL, updated_at = now(),
                       state = CASE WHEN w.workqueue_id = ANY (bare) THEN w.state
                                    ELSE w.state || '{"dispatch_error": "stage answered 0 but left the row running"}'
                               END
                 WHERE w.workqueue_id = ANY (check_answered.ids)
                   AND (w.status = 'running') IS TRUE  -- not the partial index: see header
                   AND w.dispatcher_id = check_answered.dispatcher_id
                RETURNING w.workqueue_id, w.stage
            )
            SELECT array_agg(m.workqueue_id), array_agg(m.stage)
              INTO out_ids, out_stages
              FROM moved AS m;
            EXIT;
        EXCEPTION WHEN program_limit_exceeded THEN
            IF pass > 1 THEN
                RAISE;
            END IF;
        END;
        FOR r IN
            SELECT w.workqueue_id AS id, w.state
              FROM pepsi.workqueue AS w
             WHERE w.workqueue_id = ANY (check_answered.ids)
               AND (w.status = 'running') IS TRUE
               AND w.dispatcher_id = check_answered.dispatcher_id
        LOOP
            BEGIN
                PERFORM r.state || '{"dispatch_error": "stage answered 0 but left the row running"}'::jsonb;
            EXCEPTION WHEN OTHERS THEN
                bare := bare || r.id;
                RAISE WARNING 'check_answered: row % is failed without a dispatch_error (%: %)',
                    r.id, SQLSTATE, SQLERRM;
            END;
        END LOOP;
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(out_ids, out_stages);
END
$$;

CREATE FUNCTION pepsi.claim(dispatcher_id bigint, stages text[], caps integer[], skip_locked boolean DEFAULT false, after_ids bigint[] DEFAULT NULL::bigint[]) RETURNS TABLE(workqueue_id bigint, stage text, priority integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    SET enable_sort TO 'off'
    SET jit TO 'off'
    AS $$
BEGIN
    RETURN QUERY
    SELECT c.workqueue_id, c.stage, c.priority
      FROM pepsi.claim_lines(claim.dispatcher_id, claim.stages, claim.caps,
                             claim.skip_locked, claim.after_ids, NULL) AS c;
END
$$;

CREATE FUNCTION pepsi.claim_lines(dispatcher_id bigint, stages text[], caps integer[], skip_locked boolean DEFAULT false, after_ids bigint[] DEFAULT NULL::bigint[], line_limits integer[] DEFAULT NULL::integer[]) RETURNS TABLE(workqueue_id bigint, stage text, priority integer, line text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    SET enable_sort TO 'off'
    SET jit TO 'off'
    AS $$
BEGIN
    IF claim_lines.dispatcher_id IS NULL THEN
        RAISE EXCEPTION 'claim needs a dispatcher_id' USING ERRCODE = '22004';
    END IF;
    IF cardinality(claim_lines.stages) IS DISTINCT FROM cardinality(claim_lines.caps) THEN
        RAISE EXCEPTION 'stages and caps differ in length (% vs %)',
                        cardinality(claim_lines.stages), cardinality(claim_lines.caps)
            USING ERRCODE = '22023';
    END IF;
    IF claim_lines.line_limits IS NOT NULL
       AND cardinality(claim_lines.line_limits) IS DISTINCT FROM cardinality(claim_lines.stages) THEN
        RAISE EXCEPTION 'stages and line_limits differ in length (% vs %)',
                        cardinality(claim_lines.stages), cardinality(claim_lines.line_limits)
            USING ERRCODE = '22023';
    END IF;
    IF claim_lines.after_ids IS NOT NULL
       AND cardinality(claim_lines.after_ids) IS DISTINCT FROM cardinality(claim_lines.stages) THEN
        RAISE EXCEPTION 'stages and after_ids differ in length (% vs %)',
                        cardinality(claim_lines.stages), cardinality(claim_lines.after_ids)
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    WITH moved AS (
        UPDATE pepsi.workqueue AS w
           SET status = 'running', dispatcher_id = claim_lines.dispatcher_id, updated_at = now()
         WHERE w.workqueue_id = ANY (ARRAY(
                   SELECT p.workqueue_id
                     FROM unnest(claim_lines.stages, claim_lines.caps, coalesce(claim_lines.after_ids,
                              array_fill(NULL::bigint, ARRAY[coalesce(cardinality(claim_lines.stages), 0)])))
                          AS s(stage, cap, after_id)
                    CROSS JOIN LATERAL (
                          SELECT b.workqueue_id
                            FROM ((SELECT x.workqueue_id FROM (
                                       SELECT q.workqueue_id
                                         FROM pepsi.workqueue AS q
                                        WHERE q.stage = s.stage AND q.status = 'pending'
                                         AND q.priority > 0
                                       ORDER BY q.stage, q.priority DESC, q.workqueue_id
                                       LIMIT s.cap
                                       FOR UPDATE SKIP LOCKED) AS x)
                                  UNION ALL
                                  (SELECT x.workqueue_id FROM (
                                       SELECT q.workqueue_id
                                         FROM pepsi.workqueue AS q
                                        WHERE q.stage = s.stage AND q.status = 'pending'
                                         AND q.priority >= 0 AND q.priority <= 0
                                         AND q.workqueue_id > coalesce(s.after_id, 0)
                                       ORDER BY q.stage, q.priority DESC, q.workqueue_id
                                       LIMIT s.cap
                                       FOR UPDATE SKIP LOCKED) AS x)
                                  UNION ALL
                                  (SELECT x.workqueue_id FROM (
                                       SELECT q.workqueue_id
                                         FROM pepsi.workqueue AS q
                                        WHERE q.stage = s.stage AND q.status = 'pending'
                                         AND q.priority < 0
                                       ORDER BY q.stage, q.priority DESC, q.workqueue_id
                                       LIMIT s.cap
                                       FOR UPDATE SKIP LOCKED) AS x)) AS b
                           LIMIT s.cap) AS p
                    WHERE s.cap > 0))
           AND (w.status = 'pending') IS TRUE
        RETURNING w.workqueue_id, w.stage, w.priority, w.retries, w.payload, w.state
    )
    SELECT r.workqueue_id, r.stage, r.priority,
           CASE WHEN octet_length(r.line) <= r.max_bytes THEN r.line END
      FROM (SELECT m.workqueue_id, m.stage, m.priority, lim.max_bytes,
                   CASE WHEN lim.max_bytes > 0
                         AND pg_column_size(m.payload) + pg_column_size(m.state) <= 65536
                        THEN m.workqueue_id || E'\t' || m.stage || E'\t' || m.retries
                             || E'\t' || m.payload::text || E'\t' || m.state::text
                   END AS line
              FROM moved AS m
              LEFT JOIN LATERAL (
                   SELECT max(l.max_bytes) AS max_bytes
                     FROM unnest(claim_lines.stages, claim_lines.line_limits) AS l(stage, max_bytes)
                    WHERE l.stage = m.stage) AS lim ON true
            OFFSET 0) AS r  -- not flattened: each line is rendered once
     ORDER BY r.stage, r.priority DESC, r.workqueue_id;
END
$$;

CREATE FUNCTION pepsi.copied_ids(after bigint, copied bigint) RETURNS bigint[]
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
    SELECT CASE WHEN count(*) = 1 THEN min(g.ids) END
      FROM (SELECT array_agg(w.workqueue_id ORDER BY w.workqueue_id) AS ids
              FROM pepsi.workqueue AS w
             WHERE w.workqueue_id > copied_ids.after
               AND w.xmin = pg_current_xact_id()::xid
               AND w.status = 'pending' AND w.dispatcher_id IS NULL
               AND w.retries = 0 AND w.state = '{}'
             GROUP BY w.cmin::text::bigint
            HAVING count(*) = copied_ids.copied) AS g
$$;

CREATE FUNCTION pepsi.copy_mark() RETURNS bigint
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END
      FROM pepsi.workqueue_workqueue_id_seq AS s
     WHERE (SELECT q.seqcache FROM pg_catalog.pg_sequence AS q
             WHERE q.seqrelid = 'pepsi.workqueue_workqueue_id_seq'::regclass) = 1
$$;

CREATE FUNCTION pepsi.dashboard_cancel(ids bigint[]) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF coalesce(cardinality(dashboard_cancel.ids), 0) = 0 THEN
        RETURN 0;
    END IF;
    RETURN pepsi.cancel(ids => dashboard_cancel.ids);
END
$$;

CREATE FUNCTION pepsi.dashboard_failed(reason text DEFAULT NULL::text, in_stage text DEFAULT NULL::text, max_rows integer DEFAULT 200) RETURNS TABLE(workqueue_id bigint, stage text, status text, retries integer, error text, created_at timestamp with time zone, updated_at timestamp with time zone)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
    SELECT w.workqueue_id, w.stage, w.status, w.retries, r.reason, w.created_at, w.updated_at
      FROM pepsi.messages AS w
     CROSS JOIN LATERAL (SELECT coalesce(w.state ->> 'dispatch_error', w.state ->> 'error',
                                         w.status) AS reason) AS r
     WHERE w.status IN ('failed', 'timeout', 'expired')
       AND (dashboard_failed.in_stage IS NULL OR w.stage = dashboard_failed.in_stage)
       AND (dashboard_failed.reason IS NULL OR r.reason = dashboard_failed.reason)
     ORDER BY w.workqueue_id DESC
     LIMIT greatest(coalesce(dashboard_failed.max_rows, 200), 0);
END
$$;

CREATE FUNCTION pepsi.dashboard_message(id bigint) RETURNS jsonb
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN (SELECT to_jsonb(w) || jsonb_build_object(
                       'age_seconds', extract(epoch FROM now() - w.created_at),
                       'idle_seconds', extract(epoch FROM now() - w.updated_at))
              FROM pepsi.messages AS w
             WHERE w.workqueue_id = dashboard_message.id);
END
$$;

CREATE FUNCTION pepsi.dashboard_requeue(ids bigint[]) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF coalesce(cardinality(dashboard_requeue.ids), 0) = 0 THEN
        RETURN 0;
    END IF;
    RETURN pepsi.requeue_failed(NULL, dashboard_requeue.ids);
END
$$;

CREATE FUNCTION pepsi.dashboard_reschedule(id bigint, at timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN pepsi.reschedule(dashboard_reschedule.id, dashboard_reschedule.at);
END
$$;

CREATE FUNCTION pepsi.dashboard_schedules() RETURNS jsonb
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'name', s.name, 'stage', s.stage, 'spec', s.spec,
               'last_tick', s.last_tick, 'next_tick', s.next_tick) ORDER BY s.name), '[]')
      FROM pepsi.schedules() AS s
$$;

CREATE FUNCTION pepsi.dashboard_snapshot(live_within interval DEFAULT '00:05:00'::interval) RETURNS jsonb
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    result jsonb;
BEGIN
    WITH rows_by AS (
        SELECT w.stage, w.status, count(*) AS n,
               min(w.updated_at) AS oldest,
               count(*) FILTER (WHERE w.status = 'paused' AND w.timeout <= now()) AS due
          FROM pepsi.messages AS w
         GROUP BY w.stage, w.status
    ), names AS (
        SELECT r.stage FROM rows_by AS r UNION SELECT s.stage FROM pepsi.stages AS s
    ), q AS (
        SELECT n.stage, st.status, coalesce(r.n, 0) AS n,
               coalesce(extract(epoch FROM now() - r.oldest), 0) AS oldest_age,
               coalesce(r.due, 0) AS due
          FROM names AS n
         CROSS JOIN unnest(ARRAY['pending', 'running', 'paused', 'done', 'failed', 'timeout',
                                 'expired']) AS st(status)
          LEFT JOIN rows_by AS r ON r.stage = n.stage AND r.status = st.status
    ), raw AS (
        SELECT w.stage,
               coalesce(w.state ->> 'dispatch_error', w.state ->> 'error', w.status) AS reason,
               count(*) AS n, max(w.workqueue_id) AS newest_id
          FROM pepsi.messages AS w
         WHERE w.status IN ('failed', 'timeout', 'expired')
         GROUP BY 1, 2
    ), f AS (
        SELECT r.stage, pepsi._normalise_reason(r.reason) AS reason,
               sum(r.n)::bigint AS n, max(r.newest_id) AS newest_id,
               (array_agg(jsonb_build_object('reason', r.reason, 'count', r.n)
                          ORDER BY r.n DESC, r.newest_id DESC))[1:5] AS raw
          FROM raw AS r
         GROUP BY 1, 2
         ORDER BY 3 DESC, 4 DESC
         LIMIT 100
    )
    SELECT jsonb_build_object(
        'now', extract(epoch FROM now()),
        'queue', coalesce((SELECT jsonb_agg(jsonb_build_object(
                               'stage', q.stage, 'status', q.status, 'count', q.n,
                               'oldest_age', q.oldest_age)
                               ORDER BY q.stage, q.status) FROM q), '[]'),
        'oldest_pending', coalesce((SELECT jsonb_object_agg(q.stage, q.oldest_age) FROM q
                               WHERE q.status = 'pending'), '{}'),
        'retries_due', coalesce((SELECT jsonb_object_agg(q.stage, q.due) FROM q
                               WHERE q.status = 'paused'), '{}'),
        'stage_stats', coalesce((SELECT jsonb_agg(jsonb_build_object(
                               'stage', s.stage, 'processed', s.processed, 'failed', s.failed,
                               'timeouts', s.timeouts, 'crashes', s.crashes,
                               'processing_seconds', s.processing_seconds) ORDER BY s.stage)
                               FROM pepsi._live_stats() AS s), '[]'),
        'totals', (SELECT jsonb_build_object(
                              'stage_runs', d.stage_runs + u.stage_runs,
                              'messages', d.messages + u.messages,
                              'failed', d.failed + s.failed, 'timeouts', d.timeouts + s.timeouts,
                              'crashes', d.crashes + s.crashes,
                              'requeued', d.requeued + u.requeued,
                              'expired', d.expired + u.expired)
                     FROM pepsi.dispatch_stats AS d,
                          (SELECT coalesce(sum((g.x ->> 'stage_runs')::bigint), 0) AS stage_runs,
                                  coalesce(sum((g.x ->> 'messages')::bigint), 0) AS messages,
                                  coalesce(sum((g.x ->> 'requeued')::bigint), 0) AS requeued,
                                  coalesce(sum((g.x ->> 'expired')::bigint), 0) AS expired
                             FROM (SELECT dd.gauges -> 'unflushed' -> 'dispatch' AS x
                                     FROM pepsi.dispatchers AS dd
                                    WHERE pepsi._dispatcher_live(dd.dispatcher_id)) AS g
                            WHERE jsonb_typeof(g.x) = 'object') AS u,
                          (SELECT coalesce(sum(l.failed), 0) - coalesce((SELECT sum(ss.failed)
                                      FROM pepsi.stage_stats AS ss), 0) AS failed,
                                  coalesce(sum(l.timeouts), 0) - coalesce((SELECT sum(ss.timeouts)
                                      FROM pepsi.stage_stats AS ss), 0) AS timeouts,
                                  coalesce(sum(l.crashes), 0) - coalesce((SELECT sum(ss.crashes)
                                      FROM pepsi.stage_stats AS ss), 0) AS crashes
                             FROM pepsi._live_stats() AS l) AS s
                    WHERE d.id),
        'dispatchers', coalesce((SELECT jsonb_agg(jsonb_build_object(
                               'dispatcher_id', d.dispatcher_id, 'hostname', d.hostname,
                               'pid', d.pid, 'competing', d.competing,
                               'started_at', extract(epoch FROM d.started_at),
                               'heartbeat_age', extract(epoch FROM now() - d.heartbeat_at),
                               'live', true,
                               'gauges', d.gauges) ORDER BY d.dispatcher_id)
                               FROM pepsi.dispatchers AS d
                              WHERE pepsi._dispatcher_live(d.dispatcher_id)), '[]'),
        'overlay', coalesce((SELECT jsonb_agg(jsonb_build_array(c.section, c.option, c.value)
                               ORDER BY c.section, c.option)
                               FROM pepsi.config AS c
                              WHERE lower(c.section) LIKE 'stage-%'
                                AND upper(c.option) IN ('PROGRAM', 'NEXT', 'PARALLELISM',
                                                        'QUEUE_LIMIT', 'MAX_MESSAGES',
                                                        'MAX_RETRIES', 'RETRY_DELAY',
                                                        'RETRY_DELAY_MAX', 'PAUSED')
                                AND c.value !~* '(password|passwd|secret|dsn|postgres(ql)?://|://[^/@]*@)'),
                            '[]'),
        'dispatcher_session', EXISTS (
                               -- the lock key 'pepsidsp' as (classid, objid), objsubid 1
                               SELECT 1 FROM pg_catalog.pg_locks AS l
                                WHERE l.locktype = 'advisory' AND l.granted
                                  AND l.database = (SELECT b.oid FROM pg_catalog.pg_database AS b
                                                     WHERE b.datname = current_database())
                                  AND l.classid = 1885696115::bigint::oid
                                  AND l.objid = 1768190832::bigint::oid
                                  AND l.objsubid = 1),
        'stages', coalesce((SELECT jsonb_agg(jsonb_build_object(
                               'stage', s.stage, 'next', to_jsonb(s.next),
                               'parallelism', s.parallelism, 'queue_limit', s.queue_limit,
                               'max_retries', s.max_retries) ORDER BY s.stage)
                               FROM pepsi.stages AS s), '[]'),
        'stage_health', coalesce((SELECT jsonb_agg(jsonb_build_object(
                               'stage', h.stage, 'state', h.state, 'cause', h.cause,
                               'since', extract(epoch FROM h.since),
                               'held_seconds', h.held_seconds, 'pending', h.pending,
                               'dispatchers', h.dispatchers) ORDER BY h.stage)
                               FROM pepsi.stage_health() AS h), '[]'),
        'failure_reasons', coalesce((SELECT jsonb_agg(jsonb_build_object(
                               'stage', f.stage, 'reason', f.reason, 'count', f.n,
                               'newest_id', f.newest_id, 'raw', to_jsonb(f.raw))
                               ORDER BY f.n DESC, f.newest_id DESC)
                               FROM f), '[]'))
      INTO result;
    RETURN result;
END
$$;

CREATE FUNCTION pepsi.dispatcher_registered(dispatcher_id bigint) RETURNS boolean
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN EXISTS (SELECT 1
                     FROM pepsi.dispatchers AS d
                    WHERE d.dispatcher_id = dispatcher_registered.dispatcher_id);
END
$$;

CREATE FUNCTION pepsi.enqueue(stage text, payload jsonb DEFAULT '{}'::jsonb, not_before timestamp with time zone DEFAULT NULL::timestamp with time zone, priority integer DEFAULT 0, dedupe_key text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    new_id bigint;
    later boolean := enqueue.not_before IS NOT NULL AND enqueue.not_before > now();
BEGIN
    PERFORM pepsi._check_stage(enqueue.stage);
    PERFORM pepsi._check_payload(enqueue.payload, 'payload');
    IF NOT isfinite(enqueue.not_before) THEN
        RAISE EXCEPTION 'not_before must be a finite time (got %)', enqueue.not_before
            USING ERRCODE = '22008';
    END IF;
    IF enqueue.dedupe_key IS NULL THEN
        INSERT INTO pepsi.workqueue AS w (stage, payload, status, timeout, state, priority)
        VALUES (enqueue.stage, coalesce(enqueue.payload, '{}'),
                CASE WHEN later THEN 'paused' ELSE 'pending' END,
                CASE WHEN later THEN enqueue.not_before END,
                CASE WHEN later THEN jsonb_build_object('delayed_until', enqueue.not_before)
                     ELSE '{}' END,
                coalesce(enqueue.priority, 0))
        RETURNING w.workqueue_id INTO new_id;
    ELSE
        IF enqueue.dedupe_key !~ '\S' OR octet_length(enqueue.dedupe_key) > 512 THEN
            RAISE EXCEPTION 'dedupe_key must be 1 to 512 bytes long and not only whitespace (got % bytes)',
                            octet_length(enqueue.dedupe_key)
                USING ERRCODE = '22023';
        END IF;
        LOOP
            INSERT INTO pepsi.workqueue AS w (stage, payload, status, timeout, state, priority,
                                              dedupe_key)
            VALUES (enqueue.stage, coalesce(enqueue.payload, '{}'),
                    CASE WHEN later THEN 'paused' ELSE 'pending' END,
                    CASE WHEN later THEN enqueue.not_before END,
                    CASE WHEN later THEN jsonb_build_object('delayed_until', enqueue.not_before)
                         ELSE '{}' END,
                    coalesce(enqueue.priority, 0), enqueue.dedupe_key)
            ON CONFLICT (dedupe_key)
               WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'running', 'paused')
               DO NOTHING
            RETURNING w.workqueue_id INTO new_id;
            IF new_id IS NOT NULL THEN
                EXIT;
            END IF;
            SELECT w.workqueue_id INTO new_id
              FROM pepsi.workqueue AS w
             WHERE w.dedupe_key = enqueue.dedupe_key
               AND w.status IN ('pending', 'running', 'paused');
            IF new_id IS NOT NULL THEN
                RETURN new_id;  -- the key is taken: nothing inserted, nothing delayed
            END IF;
            -- The holder became terminal between the two statements: the key is free.
        END LOOP;
    END IF;
    IF later THEN
        PERFORM pg_notify('workqueue', 'delayed');  -- learn the due time (see header)
    END IF;
    RETURN new_id;
END
$$;

CREATE FUNCTION pepsi.enqueue_lines(stage text, lines text[], not_before timestamp with time zone DEFAULT NULL::timestamp with time zone, priority integer DEFAULT 0, dedupe_keys text[] DEFAULT NULL::text[], key_field text DEFAULT NULL::text, first_line bigint DEFAULT 1) RETURNS SETOF bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET plan_cache_mode TO 'force_custom_plan'
    AS $$
#variable_conflict use_column
DECLARE
    later boolean := enqueue_lines.not_before IS NOT NULL AND enqueue_lines.not_before > now();
    base bigint := coalesce(enqueue_lines.first_line, 1) - 1;
    st text := CASE WHEN later THEN 'paused' ELSE 'pending' END;
    tmo timestamptz := CASE WHEN later THEN enqueue_lines.not_before END;
    sta jsonb := CASE WHEN later THEN jsonb_build_object('delayed_until', enqueue_lines.not_before)
                      ELSE '{}' END;
    prio integer := coalesce(enqueue_lines.priority, 0);
    keyed boolean := enqueue_lines.dedupe_keys IS NOT NULL OR enqueue_lines.key_field IS NOT NULL;
    docs jsonb[];
    keys text[];
    nums bigint[];
    got_n bigint[] := '{}';
    got_id bigint[] := '{}';
    careful boolean := false;
    bad record;
    err text;
    code text;
BEGIN
    PERFORM pepsi._check_stage(enqueue_lines.stage);
    IF NOT isfinite(enqueue_lines.not_before) THEN
        RAISE EXCEPTION 'not_before must be a finite time (got %)', enqueue_lines.not_before
            USING ERRCODE = '22008';
    END IF;
    IF enqueue_lines.dedupe_keys IS NOT NULL AND enqueue_lines.key_field IS NOT NULL THEN
        RAISE EXCEPTION 'give dedupe_keys or key_field, not both' USING ERRCODE = '22023';
    END IF;
    IF enqueue_lines.dedupe_keys IS NOT NULL
       AND cardinality(enqueue_lines.dedupe_keys) <> coalesce(cardinality(enqueue_lines.lines), 0) THEN
        RAISE EXCEPTION 'dedupe_keys and lines differ in length (% vs %)',
                        cardinality(enqueue_lines.dedupe_keys),
                        coalesce(cardinality(enqueue_lines.lines), 0)
            USING ERRCODE = '22023';
    END IF;
    IF coalesce(cardinality(enqueue_lines.lines), 0) = 0 THEN
        RETURN;
    END IF;
    BEGIN
        IF NOT keyed THEN
            -- The hot path: parse, check and insert in one pass (OFFSET 0: each
            -- line is parsed once).  A non-object line calls _bad_line, which
            -- raises.  No ORDER BY: a Function Scan returns unnest's rows in
            -- array order and an INSERT never runs in parallel, so identity
            -- values follow the lines (a sort of the payloads spilled to disk).
            RETURN QUERY
            INSERT INTO pepsi.workqueue AS w (stage, payload, status, timeout, state, priority)
            SELECT enqueue_lines.stage,
                   CASE WHEN jsonb_typeof(p.doc) = 'object' THEN p.doc
                        ELSE pepsi._bad_line(base + p.n, p.doc) END,
                   st, tmo, sta, prio
              FROM (SELECT u.n, u.l::jsonb AS doc
                      FROM unnest(enqueue_lines.lines) WITH ORDINALITY AS u(l, n)
                     WHERE u.l ~ '\S'
                    OFFSET 0) AS p
            RETURNING w.workqueue_id;
            IF later THEN
                PERFORM pg_notify('workqueue', 'delayed');  -- as enqueue: learn the due time
            END IF;
            RETURN;
        END IF;
        -- With keys: parse and check once into aligned arrays (line number,
        -- payload, key), in array order as above; the statements below only
        -- unnest them.
        SELECT array_agg(q.n), array_agg(q.doc),
               array_agg(CASE WHEN enqueue_lines.key_field IS NULL THEN q.k
                              ELSE q.doc ->> enqueue_lines.key_field END)
          INTO nums, docs, keys
          FROM (SELECT p.n, p.k,
                       CASE WHEN jsonb_typeof(p.doc) = 'object' THEN p.doc
                            ELSE pepsi._bad_line(base + p.n, p.doc) END AS doc
                  FROM (SELECT u.n, u.k, u.l::jsonb AS doc
                          FROM unnest(enqueue_lines.lines,
                                      coalesce(enqueue_lines.dedupe_keys,
                                               array_fill(NULL::text,
                                                          ARRAY[cardinality(enqueue_lines.lines)])))
                               WITH ORDINALITY AS u(l, k, n)
                         WHERE u.l ~ '\S'
                        OFFSET 0) AS p) AS q;
    EXCEPTION WHEN invalid_text_representation OR untranslatable_character
                   OR character_not_in_repertoire OR numeric_value_out_of_range
                   OR program_limit_exceeded OR statement_too_complex THEN
        -- A line jsonb does not take.  Find the first one and name it, with
        -- its own SQLSTATE (only on this path: one subtransaction per line up
        -- to it).
        FOR bad IN SELECT u.l, u.n FROM unnest(enqueue_lines.lines) WITH ORDINALITY AS u(l, n)
                    WHERE u.l ~ '\S' ORDER BY u.n LOOP
            BEGIN
                PERFORM bad.l::jsonb;
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS err = PG_EXCEPTION_DETAIL, code = RETURNED_SQLSTATE;
                RAISE EXCEPTION '%', format(
                        CASE code WHEN '22003' THEN 'line %s holds a number jsonb cannot store: %s'
                                  WHEN '54000' THEN 'line %s is too large for jsonb: %s'
                                  WHEN '54001' THEN 'line %s is nested too deeply for jsonb: %s'
                                  ELSE 'line %s is not JSON: %s' END,
                        base + bad.n, coalesce(nullif(err, ''), SQLERRM))
                    USING ERRCODE = CASE WHEN code IN ('22003', '54000', '54001') THEN code
                                         ELSE '22P02' END,
                          DETAIL = format('line %s: %s', base + bad.n, left(bad.l, 80)),
                          HINT = 'each line must be one JSON object, e.g. {"n": 1};'
                                 ' nothing of this call was enqueued';
            END;
        END LOOP;
        RAISE;  -- not from a line
    END;
    IF nums IS NULL THEN
        RETURN;  -- only blank lines
    END IF;
    SELECT k.n, k.k INTO bad
      FROM unnest(nums, keys) AS k(n, k)
     WHERE k.k !~ '\S' OR octet_length(k.k) > 512
     ORDER BY k.n LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'line %: every dedupe key must be 1 to 512 bytes long and not only whitespace (got % bytes)',
                        base + bad.n, octet_length(bad.k)
            USING ERRCODE = '22023',
                  HINT = 'give that line a key of 1 to 512 bytes that is not only whitespace, or none';
    END IF;
    IF later THEN
        PERFORM pg_notify('workqueue', 'delayed');
    END IF;
    LOOP
        -- Keys held by a live message: that message's id (a new snapshot in
        -- each round, so a key a concurrent producer committed is seen).
        WITH held AS (
            SELECT s.n, h.workqueue_id AS id
              FROM unnest(nums, keys) AS s(n, k)
              LEFT JOIN unnest(got_n) AS g(n) ON g.n = s.n
              JOIN pepsi.workqueue AS h
                ON h.dedupe_key = s.k AND h.status IN ('pending', 'running', 'paused')
             WHERE s.k IS NOT NULL AND g.n IS NULL
        )
        SELECT got_n || coalesce(array_agg(h.n), '{}'), got_id || coalesce(array_agg(h.id), '{}')
          INTO got_n, got_id
          FROM held AS h;
        EXIT WHEN cardinality(got_n) = cardinality(nums);
        -- Insert every line not yet answered: keyless ones, and the first line
        -- of each key.  A plain INSERT (ON CONFLICT's speculative insertion
        -- cost twice as much per row): the unique index still waits for a
        -- producer inserting one of these keys concurrently, and raises 23505
        -- if it commits; then this round is undone and the next looks again.
        -- First optimistically (no key held, no key twice: no join, no sort);
        -- after a 23505 carefully.
        -- Keyless lines are matched to the keyless rows inserted in ascending
        -- order (identity values are drawn in the order the SELECT produces
        -- the rows), keyed ones by key.
        BEGIN
          IF NOT careful AND cardinality(got_n) = 0 THEN
            -- No key is held (the bulk case): every line is inserted, in
            -- array order (as the keyless path), so ids pair with nums in order.
            WITH ins AS (
                INSERT INTO pepsi.workqueue AS w (stage, payload, status, timeout, state,
                                                  priority, dedupe_key)
                SELECT enqueue_lines.stage, s.p, st, tmo, sta, prio, s.k
                  FROM unnest(docs, keys) AS s(p, k)
                RETURNING w.workqueue_id
            )
            SELECT nums, array_agg(i.workqueue_id ORDER BY i.workqueue_id)
              INTO got_n, got_id
              FROM ins AS i;
          ELSE
            WITH todo AS (
                SELECT s.n, s.p, s.k
                  FROM unnest(nums, docs, keys) AS s(n, p, k)
                  LEFT JOIN unnest(got_n) AS g(n) ON g.n = s.n
                 WHERE g.n IS NULL
            ), firsts AS (
                SELECT t.n, t.p, t.k
                  FROM todo AS t
                  LEFT JOIN (SELECT t1.k, min(t1.n) AS n FROM todo AS t1
                              WHERE t1.k IS NOT NULL GROUP BY t1.k) AS m ON m.k = t.k
                 WHERE t.k IS NULL OR m.n = t.n
            ), inserted AS (
                INSERT INTO pepsi.workqueue AS w (stage, payload, status, timeout, state,
                                                  priority, dedupe_key)
                SELECT enqueue_lines.stage, f.p, st, tmo, sta, prio, f.k
                  FROM firsts AS f
                 ORDER BY f.n
                RETURNING w.workqueue_id, w.dedupe_key
            ), keyless AS (
                SELECT i.workqueue_id, row_number() OVER (ORDER BY i.workqueue_id) AS r
                  FROM inserted AS i WHERE i.dedupe_key IS NULL
            ), keyless_todo AS (
                SELECT t.n, row_number() OVER (ORDER BY t.n) AS r
                  FROM todo AS t WHERE t.k IS NULL
            ), answered AS (
                SELECT kt.n, kl.workqueue_id AS id
                  FROM keyless_todo AS kt JOIN keyless AS kl USING (r)
                UNION ALL
                SELECT t.n, i.workqueue_id
                  FROM todo AS t JOIN inserted AS i ON i.dedupe_key = t.k
            )
            SELECT got_n || coalesce(array_agg(a.n), '{}'),
                   got_id || coalesce(array_agg(a.id), '{}')
              INTO got_n, got_id
              FROM answered AS a;
          END IF;
        EXCEPTION WHEN unique_violation THEN
            -- Two lines of the call share a key, or a concurrent producer
            -- committed one: this round is undone; the next looks again and
            -- inserts only the first line of each key.
            IF careful AND current_setting('transaction_isolation') <> 'read committed' THEN
                RAISE EXCEPTION 'could not serialize access: a concurrent transaction took a dedupe key of this call'
                    USING ERRCODE = '40001', HINT = 'retry the transaction';
            END IF;
            careful := true;
        END;
        EXIT WHEN cardinality(got_n) = cardinality(nums);
    END LOOP;
    RETURN QUERY SELECT g.id FROM unnest(got_n, got_id) AS g(n, id) ORDER BY g.n;
END
$$;

CREATE FUNCTION pepsi.enqueue_many(stage text, payloads jsonb[], not_before timestamp with time zone DEFAULT NULL::timestamp with time zone, priority integer DEFAULT 0, dedupe_keys text[] DEFAULT NULL::text[]) RETURNS SETOF bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    later boolean := enqueue_many.not_before IS NOT NULL AND enqueue_many.not_before > now();
    bad record;
    ids bigint[];
    missing integer;
BEGIN
    PERFORM pepsi._check_stage(enqueue_many.stage);
    IF NOT isfinite(enqueue_many.not_before) THEN
        RAISE EXCEPTION 'not_before must be a finite time (got %)', enqueue_many.not_before
            USING ERRCODE = '22008';
    END IF;
    IF coalesce(cardinality(enqueue_many.payloads), 0) = 0 THEN
        RETURN;
    END IF;
    SELECT u.p, u.n INTO bad
      FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS u(p, n)
     WHERE u.p IS NOT NULL AND jsonb_typeof(u.p) <> 'object'
     ORDER BY u.n
     LIMIT 1;
    IF FOUND THEN
        PERFORM pepsi._check_payload(bad.p, format('payload %s of %s', bad.n,
                                                   cardinality(enqueue_many.payloads)));
    END IF;
    IF enqueue_many.dedupe_keys IS NOT NULL THEN
        IF cardinality(enqueue_many.dedupe_keys) <> cardinality(enqueue_many.payloads) THEN
            RAISE EXCEPTION 'dedupe_keys and payloads differ in length (% vs %)',
                            cardinality(enqueue_many.dedupe_keys),
                            cardinality(enqueue_many.payloads)
                USING ERRCODE = '22023';
        END IF;
        IF EXISTS (SELECT FROM unnest(enqueue_many.dedupe_keys) AS k
                    WHERE k !~ '\S' OR octet_length(k) > 512) THEN
            RAISE EXCEPTION 'every dedupe_key must be 1 to 512 bytes long and not only whitespace'
                USING ERRCODE = '22023';
        END IF;
    END IF;
    IF later THEN
        PERFORM pg_notify('workqueue', 'delayed');  -- as enqueue: learn the due time
    END IF;
    IF enqueue_many.dedupe_keys IS NULL
       OR NOT EXISTS (SELECT FROM unnest(enqueue_many.dedupe_keys) AS k WHERE k IS NOT NULL) THEN
        RETURN QUERY
        INSERT INTO pepsi.workqueue AS w (stage, payload, status, timeout, state, priority)
        SELECT enqueue_many.stage, coalesce(u.p, '{}'),
               CASE WHEN later THEN 'paused' ELSE 'pending' END,
               CASE WHEN later THEN enqueue_many.not_before END,
               CASE WHEN later THEN jsonb_build_object('delayed_until', enqueue_many.not_before)
                    ELSE '{}' END,
               coalesce(enqueue_many.priority, 0)
          FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS u(p, n)
         ORDER BY u.n
        RETURNING w.workqueue_id;
        RETURN;
    END IF;
    -- With keys.  ids[n] is element n's id; keyless elements are matched to
    -- the keyless rows inserted, both in ascending order (identity values are
    -- drawn in the order the SELECT produces the rows).
    ids := array_fill(NULL::bigint, ARRAY[cardinality(enqueue_many.payloads)]);
    LOOP
        WITH todo AS (
            SELECT u.p, u.k, u.n
              FROM unnest(enqueue_many.payloads, enqueue_many.dedupe_keys)
                   WITH ORDINALITY AS u(p, k, n)
             WHERE ids[u.n] IS NULL
        ), inserted AS (
            INSERT INTO pepsi.workqueue AS w (stage, payload, status, timeout, state, priority,
                                              dedupe_key)
            SELECT enqueue_many.stage, coalesce(t.p, '{}'),
                   CASE WHEN later THEN 'paused' ELSE 'pending' END,
                   CASE WHEN later THEN enqueue_many.not_before END,
                   CASE WHEN later THEN jsonb_build_object('delayed_until', enqueue_many.not_before)
                        ELSE '{}' END,
                   coalesce(enqueue_many.priority, 0), t.k
              FROM todo AS t
             ORDER BY t.n
            ON CONFLICT (dedupe_key)
               WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'running', 'paused')
               DO NOTHING
            RETURNING w.workqueue_id, w.dedupe_key
        ), keyless AS (
            SELECT i.workqueue_id, row_number() OVER (ORDER BY i.workqueue_id) AS r
              FROM inserted AS i WHERE i.dedupe_key IS NULL
        ), keyless_todo AS (
            SELECT t.n, row_number() OVER (ORDER BY t.n) AS r FROM todo AS t WHERE t.k IS NULL
        ), keyed AS (
            SELECT i.workqueue_id, i.dedupe_key FROM inserted AS i WHERE i.dedupe_key IS NOT NULL
        )
        SELECT array_agg(coalesce(kl.workqueue_id, kd.workqueue_id, ids[x.n]) ORDER BY x.n)
          INTO ids
          FROM generate_subscripts(ids, 1) AS x(n)
          LEFT JOIN keyless_todo AS kt ON kt.n = x.n
          LEFT JOIN keyless AS kl ON kl.r = kt.r
          LEFT JOIN keyed AS kd ON kd.dedupe_key = enqueue_many.dedupe_keys[x.n];
        -- Keys this statement did not insert: held by a live message (a
        -- concurrent one committed by now: this is a new snapshot).
        SELECT array_agg(coalesce(ids[x.n], h.workqueue_id) ORDER BY x.n)
          INTO ids
          FROM generate_subscripts(ids, 1) AS x(n)
          LEFT JOIN pepsi.workqueue AS h
                 ON ids[x.n] IS NULL
                AND h.dedupe_key = enqueue_many.dedupe_keys[x.n]
                AND h.status IN ('pending', 'running', 'paused');
        SELECT count(*) INTO missing FROM unnest(ids) AS i WHERE i IS NULL;
        EXIT WHEN missing = 0;
        -- A holder became terminal between the two statements: try those again.
    END LOOP;
    RETURN QUERY SELECT i FROM unnest(ids) WITH ORDINALITY AS u(i, n) ORDER BY u.n;
END
$$;

CREATE FUNCTION pepsi.fail(id bigint, from_stage text, reason text, dispatcher_id bigint DEFAULT NULL::bigint) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    UPDATE pepsi.workqueue AS w
       SET status = 'failed', timeout = NULL, dispatcher_id = NULL, updated_at = now(),
           state = w.state || jsonb_build_object(
                       'error', coalesce(fail.reason, 'failed without a reason'))
     WHERE w.workqueue_id = fail.id
       AND w.stage = fail.from_stage
       AND (w.status = 'running') IS TRUE  -- not the partial index: see header
       AND (fail.dispatcher_id IS NULL OR w.dispatcher_id = fail.dispatcher_id);
    RETURN FOUND;
END
$$;

CREATE FUNCTION pepsi.failed_messages(in_stage text DEFAULT NULL::text, max_rows integer DEFAULT 100, in_reason text DEFAULT NULL::text) RETURNS TABLE(workqueue_id bigint, stage text, status text, retries integer, error text, updated_at timestamp with time zone, payload jsonb, reason text)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
    SELECT f.workqueue_id, f.stage, f.status, f.retries, f.raw, f.updated_at, f.payload,
           pepsi._normalise_reason(f.raw)
      FROM (SELECT w.workqueue_id, w.stage, w.status, w.retries, w.updated_at, w.payload,
                   coalesce(w.state ->> 'dispatch_error', w.state ->> 'error', w.status) AS raw
              FROM pepsi.messages AS w
             WHERE w.status IN ('failed', 'timeout', 'expired')
               AND (failed_messages.in_stage IS NULL OR w.stage = failed_messages.in_stage)) AS f
     WHERE failed_messages.in_reason IS NULL
        OR pepsi._normalise_reason(f.raw) = failed_messages.in_reason
     ORDER BY f.workqueue_id DESC
     LIMIT greatest(coalesce(failed_messages.max_rows, 100), 0);
END
$$;

CREATE FUNCTION pepsi.failed_reasons(in_stage text DEFAULT NULL::text) RETURNS TABLE(stage text, status text, reason text, count bigint, oldest timestamp with time zone, newest timestamp with time zone, ids bigint[], examples text[])
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
    SELECT g.stage, g.status, g.pattern, count(*)::bigint, min(g.updated_at),
           max(g.updated_at),
           (array_agg(g.workqueue_id ORDER BY g.workqueue_id DESC))[1:5],
           (SELECT array_agg(e.raw) FROM (
                SELECT x.raw FROM unnest(array_agg(g.raw ORDER BY g.workqueue_id DESC))
                       WITH ORDINALITY AS x(raw, n)
                 GROUP BY x.raw ORDER BY min(x.n) LIMIT 3) AS e)
      FROM (SELECT w.stage, w.status, w.workqueue_id, w.updated_at, r.raw,
                   pepsi._normalise_reason(r.raw) AS pattern
              FROM pepsi.messages AS w
             CROSS JOIN LATERAL (SELECT coalesce(w.state ->> 'dispatch_error',
                                                 w.state ->> 'error', w.status) AS raw) AS r
             WHERE w.status IN ('failed', 'timeout', 'expired')
               AND (failed_reasons.in_stage IS NULL OR w.stage = failed_reasons.in_stage)) AS g
     GROUP BY g.stage, g.status, g.pattern
     ORDER BY count(*) DESC, g.stage, g.status, g.pattern;
END
$$;

CREATE FUNCTION pepsi.finish(id bigint, from_stage text, dispatcher_id bigint DEFAULT NULL::bigint) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    UPDATE pepsi.workqueue AS w
       SET status = 'done', timeout = NULL, dispatcher_id = NULL, updated_at = now()
     WHERE w.workqueue_id = finish.id
       AND w.stage = finish.from_stage
       AND (w.status = 'running') IS TRUE  -- not the partial index: see header
       AND (finish.dispatcher_id IS NULL OR w.dispatcher_id = finish.dispatcher_id);
    RETURN FOUND;
END
$$;

CREATE FUNCTION pepsi.finish_many(ids bigint[], from_stage text, dispatcher_id bigint DEFAULT NULL::bigint) RETURNS SETOF bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
BEGIN
    RETURN QUERY
    UPDATE pepsi.workqueue AS w
       SET status = 'done', timeout = NULL, dispatcher_id = NULL, updated_at = now()
     WHERE w.workqueue_id = ANY (finish_many.ids)
       AND w.stage = finish_many.from_stage
       AND (w.status = 'running') IS TRUE  -- not the partial index: see header
       AND (finish_many.dispatcher_id IS NULL OR w.dispatcher_id = finish_many.dispatcher_id)
    RETURNING w.workqueue_id;
END
$$;

CREATE FUNCTION pepsi.fire_schedule(name text, ticks timestamp with time zone[], stage text, payload jsonb DEFAULT '{}'::jsonb, priority integer DEFAULT 0, dedupe_key text DEFAULT NULL::text, next_tick timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS TABLE(tick timestamp with time zone, workqueue_id bigint, inserted boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    SET lock_timeout TO '200ms'
    AS $_$
#variable_conflict use_column
DECLARE
    settled timestamptz;
    t timestamptz;
    id bigint;
    fired timestamptz;
BEGIN
    IF fire_schedule.name IS NULL OR fire_schedule.name !~ '^[A-Za-z0-9_.-]+$' THEN
        RAISE EXCEPTION 'fire_schedule: invalid schedule name %',
                        coalesce(quote_literal(fire_schedule.name), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    PERFORM pepsi._check_stage(fire_schedule.stage);
    PERFORM pepsi._check_payload(fire_schedule.payload, 'payload');
    IF EXISTS (SELECT FROM unnest(fire_schedule.ticks) AS x WHERE NOT isfinite(x)) THEN
        RAISE EXCEPTION 'fire_schedule: ticks must be finite times' USING ERRCODE = '22008';
    END IF;
    IF fire_schedule.dedupe_key IS NOT NULL
       AND (fire_schedule.dedupe_key !~ '\S' OR octet_length(fire_schedule.dedupe_key) > 512) THEN
        RAISE EXCEPTION 'dedupe_key must be 1 to 512 bytes long and not only whitespace (got % bytes)',
                        octet_length(fire_schedule.dedupe_key)
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO pepsi.schedule_ticks AS s (name, stage, settled_through)
    VALUES (fire_schedule.name, fire_schedule.stage, '-infinity')
    ON CONFLICT (name) DO NOTHING;
    SELECT s.settled_through INTO settled
      FROM pepsi.schedule_ticks AS s
     WHERE s.name = fire_schedule.name
       FOR UPDATE;
    FOR t IN SELECT DISTINCT x FROM unnest(fire_schedule.ticks) AS x
              WHERE x IS NOT NULL AND x > settled ORDER BY x LOOP
        id := NULL;
        LOOP
            INSERT INTO pepsi.workqueue AS w (stage, payload, priority, dedupe_key, state)
            VALUES (fire_schedule.stage, coalesce(fire_schedule.payload, '{}'),
                    coalesce(fire_schedule.priority, 0), fire_schedule.dedupe_key,
                    jsonb_build_object('scheduled_for', t,
                                       'scheduled_by', fire_schedule.name))
            ON CONFLICT (dedupe_key)
               WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'running', 'paused')
               DO NOTHING
            RETURNING w.workqueue_id INTO id;
            IF id IS NOT NULL THEN
                fired := t;
                tick := t; workqueue_id := id; inserted := true;
                RETURN NEXT;
                EXIT;
            END IF;
            SELECT w.workqueue_id INTO id
              FROM pepsi.workqueue AS w
             WHERE w.dedupe_key = fire_schedule.dedupe_key
               AND w.status IN ('pending', 'running', 'paused');
            IF id IS NOT NULL THEN
                tick := t; workqueue_id := id; inserted := false;
                RETURN NEXT;
                EXIT;
            END IF;
        END LOOP;
    END LOOP;
    UPDATE pepsi.schedule_ticks AS s
       SET settled_through = greatest(s.settled_through,
                                      coalesce((SELECT max(x) FROM unnest(fire_schedule.ticks) AS x),
                                               s.settled_through)),
           last_tick = coalesce(fired, s.last_tick),
           next_tick = coalesce(fire_schedule.next_tick, s.next_tick),
           stage = fire_schedule.stage,
           updated_at = now()
     WHERE s.name = fire_schedule.name;
END
$_$;

CREATE FUNCTION pepsi.flush_stats(stages text[], processed bigint[], failed bigint[], timeouts bigint[], crashes bigint[], seconds double precision[], stage_runs bigint, messages bigint, requeued bigint, expired bigint) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n integer := coalesce(cardinality(flush_stats.stages), 0);
    sum_failed bigint;
    sum_timeouts bigint;
    sum_crashes bigint;
BEGIN
    IF coalesce(cardinality(flush_stats.processed), n) <> n
       OR coalesce(cardinality(flush_stats.failed), n) <> n
       OR coalesce(cardinality(flush_stats.timeouts), n) <> n
       OR coalesce(cardinality(flush_stats.crashes), n) <> n
       OR coalesce(cardinality(flush_stats.seconds), n) <> n THEN
        RAISE EXCEPTION 'flush_stats: per-stage arrays differ in length'
            USING ERRCODE = '22023';
    END IF;

    WITH d AS (
        SELECT u.stage,
               sum(coalesce(u.p, 0))::bigint  AS p,
               sum(coalesce(u.f, 0))::bigint  AS f,
               sum(coalesce(u.t, 0))::bigint  AS t,
               sum(coalesce(u.c, 0))::bigint  AS c,
               sum(coalesce(u.s, 0))::float8  AS s
          FROM unnest(flush_stats.stages, flush_stats.processed, flush_stats.failed,
                      flush_stats.timeouts, flush_stats.crashes, flush_stats.seconds)
               AS u(stage, p, f, t, c, s)
         WHERE u.stage IS NOT NULL
         GROUP BY u.stage
    ), up AS (
        INSERT INTO pepsi.stage_stats AS ss
               (stage, processed, failed, timeouts, crashes, processing_seconds, updated_at)
        SELECT d.stage, d.p, d.f, d.t, d.c, d.s, now()
          FROM d
         WHERE d.p <> 0 OR d.f <> 0 OR d.t <> 0 OR d.c <> 0 OR d.s <> 0
        ON CONFLICT (stage) DO UPDATE
           SET processed = ss.processed + EXCLUDED.processed,
               failed = ss.failed + EXCLUDED.failed,
               timeouts = ss.timeouts + EXCLUDED.timeouts,
               crashes = ss.crashes + EXCLUDED.crashes,
               processing_seconds = ss.processing_seconds + EXCLUDED.processing_seconds,
               updated_at = now()
        RETURNING 1
    )
    SELECT coalesce(sum(d.f), 0), coalesce(sum(d.t), 0), coalesce(sum(d.c), 0)
      INTO sum_failed, sum_timeouts, sum_crashes
      FROM d;

    IF coalesce(flush_stats.stage_runs, 0) <> 0 OR coalesce(flush_stats.messages, 0) <> 0
       OR coalesce(flush_stats.requeued, 0) <> 0 OR coalesce(flush_stats.expired, 0) <> 0
       OR sum_failed <> 0 OR sum_timeouts <> 0 OR sum_crashes <> 0 THEN
        UPDATE pepsi.dispatch_stats AS g
           SET stage_runs = g.stage_runs + coalesce(flush_stats.stage_runs, 0),
               messages = g.messages + coalesce(flush_stats.messages, 0),
               failed = g.failed + sum_failed,
               timeouts = g.timeouts + sum_timeouts,
               crashes = g.crashes + sum_crashes,
               requeued = g.requeued + coalesce(flush_stats.requeued, 0),
               expired = g.expired + coalesce(flush_stats.expired, 0),
               updated_at = now()
         WHERE g.id;
    END IF;
END
$$;

CREATE FUNCTION pepsi.get_message(id bigint) RETURNS TABLE(workqueue_id bigint, stage text, status text, payload jsonb, state jsonb, retries integer)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
    SELECT w.workqueue_id, w.stage, w.status, w.payload, w.state, w.retries
      FROM pepsi.messages AS w
     WHERE w.workqueue_id = get_message.id;
END
$$;

CREATE FUNCTION pepsi.get_messages(ids bigint[]) RETURNS TABLE(workqueue_id bigint, stage text, status text, payload jsonb, state jsonb, retries integer)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
BEGIN
    RETURN QUERY
    SELECT w.workqueue_id, w.stage, w.status, w.payload, w.state, w.retries
      FROM unnest(get_messages.ids) WITH ORDINALITY AS u(id, n)
      JOIN pepsi.workqueue AS w ON w.workqueue_id = u.id
     ORDER BY u.n;
END
$$;

CREATE FUNCTION pepsi.heartbeat(dispatcher_id bigint, gauges jsonb DEFAULT NULL::jsonb) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF heartbeat.dispatcher_id IS NULL THEN
        RAISE EXCEPTION 'heartbeat needs a dispatcher_id' USING ERRCODE = '22004';
    END IF;
    UPDATE pepsi.dispatchers AS d
       SET heartbeat_at = now(),
           gauges = coalesce(heartbeat.gauges, d.gauges)
     WHERE d.dispatcher_id = heartbeat.dispatcher_id;
    IF NOT FOUND THEN
        INSERT INTO pepsi.dispatchers (dispatcher_id, hostname, pid, competing, gauges)
        OVERRIDING SYSTEM VALUE
        VALUES (heartbeat.dispatcher_id, 're-registered by heartbeat', 0, true, heartbeat.gauges)
        ON CONFLICT DO NOTHING;
        RAISE WARNING 'dispatcher % was not registered (declared dead by a replica); re-registered',
                      heartbeat.dispatcher_id;
    END IF;
    PERFORM pepsi._dispatcher_hold(heartbeat.dispatcher_id);
END
$$;

CREATE FUNCTION pepsi.held_ids(dispatcher_id bigint) RETURNS TABLE(workqueue_id bigint)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
    SELECT w.workqueue_id
      FROM pepsi.workqueue AS w
     WHERE w.status = 'running'
       AND w.dispatcher_id = held_ids.dispatcher_id
     ORDER BY w.workqueue_id;
END
$$;

CREATE FUNCTION pepsi.hop(id bigint, from_stage text, to_stage text, dispatcher_id bigint DEFAULT NULL::bigint) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pepsi._check_stage(hop.to_stage);
    UPDATE pepsi.workqueue AS w
       SET stage = hop.to_stage, retries = 0, updated_at = now()
     WHERE w.workqueue_id = hop.id
       AND w.stage = hop.from_stage
       AND (w.status = 'running') IS TRUE  -- not the partial index: see header
       AND (hop.dispatcher_id IS NULL OR w.dispatcher_id = hop.dispatcher_id);
    RETURN FOUND;
END
$$;

CREATE FUNCTION pepsi.keep_dead_letters(batch_size integer DEFAULT 1000) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n integer;
BEGIN
    IF coalesce(keep_dead_letters.batch_size, 0) <= 0 THEN
        RETURN 0;
    END IF;
    WITH moved AS (
        DELETE FROM pepsi.workqueue AS w
         WHERE w.workqueue_id = ANY (ARRAY(
                   SELECT k.workqueue_id
                     FROM pepsi.workqueue AS k
                    WHERE k.status IN ('failed', 'timeout', 'expired')
                    ORDER BY k.stage, k.workqueue_id
                    LIMIT keep_dead_letters.batch_size
                      FOR UPDATE SKIP LOCKED))
           AND w.status IN ('failed', 'timeout', 'expired')
        RETURNING w.workqueue_id, w.stage, w.status, w.payload, w.state, w.timeout, w.retries,
                  w.created_at, w.updated_at, w.dispatcher_id, w.priority, w.dedupe_key
    )
    INSERT INTO pepsi.dead_letters (workqueue_id, stage, status, payload, state, timeout, retries,
                                    created_at, updated_at, dispatcher_id, priority, dedupe_key)
    SELECT * FROM moved;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

CREATE FUNCTION pepsi.key_holders(keys text[]) RETURNS TABLE(dedupe_key text, workqueue_id bigint)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET plan_cache_mode TO 'force_custom_plan'
    AS $$
    SELECT h.dedupe_key, h.workqueue_id
      FROM pepsi.workqueue AS h
     WHERE h.dedupe_key = ANY (key_holders.keys)
       AND h.dedupe_key IS NOT NULL
       AND h.status IN ('pending', 'running', 'paused');
$$;

CREATE FUNCTION pepsi.list_messages(statuses text[] DEFAULT NULL::text[], in_stage text DEFAULT NULL::text, older_than interval DEFAULT NULL::interval, payload_contains jsonb DEFAULT NULL::jsonb, before_id bigint DEFAULT NULL::bigint, max_rows integer DEFAULT 50, reason_group text DEFAULT NULL::text) RETURNS TABLE(workqueue_id bigint, stage text, status text, kind text, retries integer, created_at timestamp with time zone, updated_at timestamp with time zone, due timestamp with time zone, reason text, payload jsonb)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    paused_stages text[];
BEGIN
    IF list_messages.statuses IS NULL OR 'pending' = ANY (list_messages.statuses) THEN
        SELECT coalesce(array_agg(h.stage), '{}') INTO paused_stages
          FROM pepsi.stage_health() AS h WHERE h.state = 'paused';
    END IF;
    RETURN QUERY EXECUTE pepsi._list_messages_sql(
        list_messages.statuses, list_messages.in_stage, list_messages.older_than,
        list_messages.payload_contains, list_messages.before_id, list_messages.max_rows,
        list_messages.reason_group, paused_stages);
END
$$;

CREATE FUNCTION pepsi.message_history(id bigint) RETURNS TABLE(attempt integer, stage text, started_at timestamp with time zone, ended_at timestamp with time zone, outcome text, reason text, traceback text)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    w pepsi.workqueue%ROWTYPE;
    last_stage text;
BEGIN
    SELECT * INTO w FROM pepsi.messages AS q WHERE q.workqueue_id = message_history.id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT a.attempt, a.stage, a.started_at, a.ended_at, a.outcome, a.reason, a.traceback
      FROM pepsi.attempts AS a
     WHERE a.workqueue_id = message_history.id
     ORDER BY a.attempt;
    SELECT a.stage INTO last_stage
      FROM pepsi.attempts AS a
     WHERE a.workqueue_id = message_history.id
     ORDER BY a.attempt DESC LIMIT 1;
    IF last_stage IS NOT NULL AND last_stage <> w.stage THEN
        RETURN QUERY SELECT NULL::integer, last_stage, NULL::timestamptz, NULL::timestamptz,
                            'left'::text, 'now at stage ' || w.stage, NULL::text;
    END IF;
    IF w.status = 'done' THEN
        RETURN QUERY SELECT NULL::integer, w.stage, NULL::timestamptz, w.updated_at,
                            'done'::text, NULL::text, NULL::text;
    ELSIF w.status = 'running' THEN
        RETURN QUERY SELECT NULL::integer, w.stage, w.updated_at, NULL::timestamptz,
                            'running'::text, NULL::text, NULL::text;
    END IF;
END
$$;

CREATE FUNCTION pepsi.message_story(id bigint) RETURNS TABLE(workqueue_id bigint, stage text, status text, payload jsonb, state jsonb, retries integer, max_retries integer, delayed boolean, timeout timestamp with time zone, created_at timestamp with time zone, updated_at timestamp with time zone, dispatcher_id bigint, error text, errors jsonb, age interval, since_update interval, due_in interval, stage_registered boolean, priority integer, dedupe_key text)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
    SELECT w.workqueue_id, w.stage, w.status, w.payload, w.state, w.retries,
           s.max_retries, w.status = 'paused' AND w.state ? 'delayed_until', w.timeout, w.created_at, w.updated_at,
           w.dispatcher_id,
           coalesce(w.state ->> 'dispatch_error', w.state ->> 'error'),
           jsonb_strip_nulls(jsonb_build_object(
               'error', w.state -> 'error',
               'dispatch_error', w.state -> 'dispatch_error',
               'retry_error', CASE WHEN w.status = 'paused' THEN w.state -> 'retry_error' END,
               'pause_reason', CASE WHEN w.status = 'paused' THEN w.state -> 'pause_reason' END,
               'previous_error', w.state -> 'previous_error')),
           now() - w.created_at,
           now() - w.updated_at,
           CASE WHEN w.status = 'paused' AND isfinite(w.timeout) THEN w.timeout - now() END,
           s.stage IS NOT NULL,
           w.priority, w.dedupe_key
      FROM pepsi.messages AS w
      LEFT JOIN pepsi.stages AS s ON s.stage = w.stage
     WHERE w.workqueue_id = message_story.id;
END
$$;

CREATE FUNCTION pepsi.metrics() RETURNS text
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    snap jsonb := pepsi.dashboard_snapshot();
    out text := '';
    fam record;
BEGIN
    FOR fam IN
        SELECT * FROM (VALUES
            (1, 'processed', 'Messages a stage processed successfully.'),
            (2, 'failed', 'Messages that failed at a stage.'),
            (3, 'timeouts', 'Messages that hit MAX_RUNTIME at a stage.'),
            (4, 'crashes', 'Worker crashes at a stage.'),
            (5, 'processing_seconds', 'Seconds workers of a stage spent on messages.')
        ) AS v(ord, col, help)
        ORDER BY ord
    LOOP
        out := out || format(E'# HELP pepsi_stage_%s_total %s\n# TYPE pepsi_stage_%s_total counter\n',
                             fam.col, fam.help, fam.col);
        out := out || coalesce((
            SELECT string_agg(format(E'pepsi_stage_%s_total{stage="%s"} %s\n',
                                     fam.col, s ->> 'stage', s ->> fam.col),
                              '' ORDER BY s ->> 'stage')
              FROM jsonb_array_elements(snap -> 'stage_stats') AS s), '');
    END LOOP;

    FOR fam IN
        SELECT * FROM (VALUES
            (1, 'stage_runs', 'Stage executions, fused ones included.'),
            (2, 'messages', 'Message ids handed to workers.'),
            (3, 'failed', 'Messages failed, all stages.'),
            (4, 'timeouts', 'Messages timed out, all stages.'),
            (5, 'crashes', 'Worker crashes, all stages.'),
            (6, 'requeued', 'Paused messages flipped back to pending.'),
            (7, 'expired', 'Messages expired (older than EXPIRY).')
        ) AS v(ord, name, help)
        ORDER BY ord
    LOOP
        out := out || format(E'# HELP pepsi_queue_%s_total %s\n# TYPE pepsi_queue_%s_total counter\npepsi_queue_%s_total %s\n',
                             fam.name, fam.help, fam.name, fam.name,
                             coalesce(snap -> 'totals' ->> fam.name, '0'));
    END LOOP;

    out := out || E'# HELP pepsi_queue_depth Rows in pepsi.workqueue by stage and status.\n'
               || E'# TYPE pepsi_queue_depth gauge\n'
               || coalesce((
                   SELECT string_agg(format(E'pepsi_queue_depth{stage="%s",status="%s"} %s\n',
                                            q ->> 'stage', q ->> 'status', q ->> 'count'),
                                     '' ORDER BY q ->> 'stage', q ->> 'status')
                     FROM jsonb_array_elements(snap -> 'queue') AS q), '');

    out := out || E'# HELP pepsi_queue_retries_due Paused rows whose time has come (requeue_due flips them to pending).\n'
               || E'# TYPE pepsi_queue_retries_due gauge\n'
               || coalesce((
                   SELECT string_agg(format(E'pepsi_queue_retries_due{stage="%s"} %s\n',
                                            d.key, d.value), '' ORDER BY d.key)
                     FROM jsonb_each_text(snap -> 'retries_due') AS d), '');
    RETURN out;
END
$$;

CREATE FUNCTION pepsi.note_traceback(id bigint, from_stage text, traceback text, dispatcher_id bigint DEFAULT NULL::bigint) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    body text := note_traceback.traceback;
BEGIN
    IF body IS NULL THEN
        RETURN false;
    END IF;
    IF length(body) > 4000 THEN
        body := left(body, 1000) || E'\n…\n' || right(body, 2900);
    END IF;
    INSERT INTO pepsi.tracebacks AS t (workqueue_id, traceback)
    SELECT w.workqueue_id, body
      FROM pepsi.workqueue AS w
     WHERE w.workqueue_id = note_traceback.id
       AND w.status = 'running'
       AND w.stage = note_traceback.from_stage
       AND (note_traceback.dispatcher_id IS NULL
            OR w.dispatcher_id = note_traceback.dispatcher_id)
    ON CONFLICT (workqueue_id) DO UPDATE SET traceback = excluded.traceback, noted_at = now();
    RETURN FOUND;
END
$$;

CREATE FUNCTION pepsi.pause(id bigint, from_stage text, until timestamp with time zone, reason text DEFAULT NULL::text, dispatcher_id bigint DEFAULT NULL::bigint) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF pause.until IS NULL THEN
        RAISE EXCEPTION 'pause needs a time to resume (until is NULL)'
            USING ERRCODE = '22004';
    END IF;
    IF NOT isfinite(pause.until) THEN
        RAISE EXCEPTION 'pause needs a finite time to resume (until is %)', pause.until
            USING ERRCODE = '22008',
                  HINT = 'fail the message instead, or pause it until a real point in time';
    END IF;
    UPDATE pepsi.workqueue AS w
       SET status = 'paused', timeout = pause.until, dispatcher_id = NULL,
           updated_at = now(),
           state = CASE WHEN pause.reason IS NULL THEN w.state
                        ELSE w.state || jsonb_build_object('pause_reason', pause.reason) END
     WHERE w.workqueue_id = pause.id
       AND w.stage = pause.from_stage
       AND (w.status = 'running') IS TRUE  -- not the partial index: see header
       AND (pause.dispatcher_id IS NULL OR w.dispatcher_id = pause.dispatcher_id);
    RETURN FOUND;
END
$$;

CREATE FUNCTION pepsi.pause_stage(stage text, paused boolean) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $_$
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
$_$;

CREATE FUNCTION pepsi.pin_messages(ids bigint[], dispatcher_id bigint) RETURNS TABLE(workqueue_id bigint, stage text, status text, payload jsonb, state jsonb, retries integer, held_by bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
DECLARE
    n integer;
BEGIN
    RETURN QUERY
    SELECT w.workqueue_id, w.stage, w.status, w.payload, w.state, w.retries, w.dispatcher_id
      FROM pepsi.workqueue AS w
     WHERE w.workqueue_id = ANY (pin_messages.ids)
       AND w.status = 'running'
       AND w.dispatcher_id = pin_messages.dispatcher_id
     ORDER BY w.workqueue_id
       FOR NO KEY UPDATE;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n < coalesce(cardinality(pin_messages.ids), 0) THEN
        RETURN QUERY
        SELECT w.workqueue_id, w.stage, w.status, w.payload, w.state, w.retries,
               w.dispatcher_id
          FROM pepsi.workqueue AS w
         WHERE w.workqueue_id = ANY (pin_messages.ids)
           AND NOT (w.status = 'running'
                    AND w.dispatcher_id IS NOT DISTINCT FROM pin_messages.dispatcher_id);
    END IF;
END
$$;

CREATE FUNCTION pepsi.purge(statuses text[], stage text DEFAULT NULL::text, older_than interval DEFAULT NULL::interval, dry_run boolean DEFAULT false) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n bigint;
    gone_ids bigint[];
BEGIN
    IF purge.statuses IS NULL OR cardinality(purge.statuses) = 0
       OR NOT purge.statuses <@ ARRAY['done', 'failed', 'timeout', 'expired'] THEN
        RAISE EXCEPTION 'purge deletes only terminal rows: statuses must be among done, failed, timeout, expired (got %)',
                        coalesce(purge.statuses::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF coalesce(purge.dry_run, false) THEN
        SELECT count(*) INTO n
          FROM pepsi.messages AS w
         WHERE w.status = ANY (purge.statuses)
           AND (purge.stage IS NULL OR w.stage = purge.stage)
           AND (purge.older_than IS NULL OR w.updated_at < now() - purge.older_than);
        RETURN n;
    END IF;
    WITH gone AS (
        DELETE FROM pepsi.workqueue AS w
         WHERE w.status = ANY (purge.statuses)
           AND (purge.stage IS NULL OR w.stage = purge.stage)
           AND (purge.older_than IS NULL OR w.updated_at < now() - purge.older_than)
        RETURNING w.workqueue_id
    ), kept_gone AS (
        DELETE FROM pepsi.dead_letters AS d
         WHERE d.status = ANY (purge.statuses)
           AND (purge.stage IS NULL OR d.stage = purge.stage)
           AND (purge.older_than IS NULL OR d.updated_at < now() - purge.older_than)
        RETURNING d.workqueue_id
    )
    SELECT array_agg(x.workqueue_id) INTO gone_ids
      FROM (SELECT g.workqueue_id FROM gone AS g
            UNION ALL SELECT k.workqueue_id FROM kept_gone AS k) AS x;
    n := coalesce(cardinality(gone_ids), 0);
    IF n > 0 THEN
        DELETE FROM pepsi.attempts AS a WHERE a.workqueue_id = ANY (gone_ids);
        DELETE FROM pepsi.tracebacks AS t WHERE t.workqueue_id = ANY (gone_ids);
    END IF;
    RETURN n;
END
$$;

CREATE FUNCTION pepsi.purge_done(retention interval, batch_size integer DEFAULT 1000) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n integer;
    gone_ids bigint[];
BEGIN
    IF purge_done.retention IS NULL OR purge_done.retention <= interval '0'
       OR coalesce(purge_done.batch_size, 0) <= 0 THEN
        RETURN 0;
    END IF;
    WITH gone AS (
        DELETE FROM pepsi.workqueue AS w
         WHERE w.workqueue_id = ANY (ARRAY(
                   SELECT d.workqueue_id
                     FROM pepsi.workqueue AS d
                    WHERE d.status = 'done' AND d.updated_at < now() - purge_done.retention
                    ORDER BY d.updated_at
                    LIMIT purge_done.batch_size
                      FOR UPDATE SKIP LOCKED))
           AND w.status = 'done'
        RETURNING w.workqueue_id
    )
    SELECT array_agg(g.workqueue_id) INTO gone_ids FROM gone AS g;
    n := coalesce(cardinality(gone_ids), 0);
    IF n > 0 THEN  -- the history of a message goes with it (retried, then done)
        DELETE FROM pepsi.attempts AS a WHERE a.workqueue_id = ANY (gone_ids);
        DELETE FROM pepsi.tracebacks AS t WHERE t.workqueue_id = ANY (gone_ids);
    END IF;
    RETURN n;
END
$$;

CREATE FUNCTION pepsi.queue_counts() RETURNS TABLE(stage text, status text, count bigint)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
    SELECT w.stage, w.status, count(*)::bigint
      FROM pepsi.messages AS w
     GROUP BY w.stage, w.status
     ORDER BY w.stage, w.status;
END
$$;

CREATE FUNCTION pepsi.queue_dispatchers() RETURNS TABLE(dispatcher_id bigint, hostname text, pid integer, competing boolean, started_at timestamp with time zone, heartbeat_age interval, running bigint, live boolean)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
    SELECT d.dispatcher_id, d.hostname, d.pid, d.competing, d.started_at,
           now() - d.heartbeat_at,
           (SELECT count(*) FROM pepsi.workqueue AS w
             WHERE w.status = 'running' AND w.dispatcher_id = d.dispatcher_id),
           pepsi._dispatcher_live(d.dispatcher_id)
      FROM pepsi.dispatchers AS d
     ORDER BY d.dispatcher_id;
END
$$;

CREATE FUNCTION pepsi.queue_overview() RETURNS TABLE(stage text, pending bigint, running bigint, paused bigint, done bigint, failed bigint, timeout bigint, expired bigint, oldest_pending interval, next_due interval, done_last_minute bigint, processed_total bigint, failed_total bigint, timeouts_total bigint, crashes_total bigint, processing_seconds double precision, registered boolean, parallelism integer, queue_limit integer, dispatchers bigint, workers bigint, workers_busy bigint, workers_idle bigint, workers_retiring bigint, workers_stopping bigint)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
    WITH live AS (
        SELECT w.stage,
               count(*) FILTER (WHERE w.status = 'pending') AS pending,
               count(*) FILTER (WHERE w.status = 'running') AS running,
               count(*) FILTER (WHERE w.status = 'paused') AS paused,
               count(*) FILTER (WHERE w.status = 'done') AS done,
               count(*) FILTER (WHERE w.status = 'failed') AS failed,
               count(*) FILTER (WHERE w.status = 'timeout') AS timeout,
               count(*) FILTER (WHERE w.status = 'expired') AS expired,
               now() - min(w.updated_at) FILTER (WHERE w.status = 'pending') AS oldest_pending,
               min(w.timeout) FILTER (WHERE w.status = 'paused' AND isfinite(w.timeout))
                   - now() AS next_due,
               count(*) FILTER (WHERE w.status = 'done'
                                  AND w.updated_at > now() - interval '60 s') AS done_1m
          FROM pepsi.messages AS w
         GROUP BY w.stage
    ), live_dispatchers AS (
        SELECT d.gauges -> 'workers' AS workers
          FROM pepsi.dispatchers AS d
         WHERE jsonb_typeof(d.gauges -> 'workers') = 'object'
           AND pepsi._dispatcher_live(d.dispatcher_id)
    ), gauged AS (
        SELECT ws.key AS stage,
               count(*) AS dispatchers,
               sum(coalesce((ws.value ->> 'busy')::bigint, 0))::bigint AS busy,
               sum(coalesce((ws.value ->> 'idle')::bigint, 0))::bigint AS idle,
               sum(coalesce((ws.value ->> 'retiring')::bigint, 0))::bigint AS retiring,
               sum(coalesce((ws.value ->> 'stopping')::bigint, 0))::bigint AS stopping
          FROM live_dispatchers AS ld
         CROSS JOIN LATERAL jsonb_each(CASE WHEN jsonb_typeof(ld.workers) = 'object'
                                            THEN ld.workers ELSE '{}' END) AS ws
         WHERE jsonb_typeof(ws.value) = 'object'
         GROUP BY ws.key
    ), names AS (
        SELECT l.stage FROM live AS l
        UNION SELECT ss.stage FROM pepsi._live_stats() AS ss
        UNION SELECT s.stage FROM pepsi.stages AS s
        UNION SELECT g.stage FROM gauged AS g
    )
    SELECT n.stage,
           coalesce(l.pending, 0), coalesce(l.running, 0), coalesce(l.paused, 0),
           coalesce(l.done, 0), coalesce(l.failed, 0), coalesce(l.timeout, 0),
           coalesce(l.expired, 0), l.oldest_pending, l.next_due, coalesce(l.done_1m, 0),
           coalesce(ss.processed, 0), coalesce(ss.failed, 0), coalesce(ss.timeouts, 0),
           coalesce(ss.crashes, 0), coalesce(ss.processing_seconds, 0),
           s.stage IS NOT NULL, s.parallelism, s.queue_limit,
           coalesce(g.dispatchers, 0),
           coalesce(g.busy + g.idle + g.retiring + g.stopping, 0),
           coalesce(g.busy, 0), coalesce(g.idle, 0), coalesce(g.retiring, 0),
           coalesce(g.stopping, 0)
      FROM names AS n
      LEFT JOIN live AS l ON l.stage = n.stage
      LEFT JOIN pepsi._live_stats() AS ss ON ss.stage = n.stage
      LEFT JOIN pepsi.stages AS s ON s.stage = n.stage
      LEFT JOIN gauged AS g ON g.stage = n.stage
     ORDER BY n.stage;
END
$$;

CREATE FUNCTION pepsi.record_dispatch_error(dispatcher_id bigint, ids bigint[], statuses text[], errors text[]) RETURNS TABLE(workqueue_id bigint, stage text, status text, timeout timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    bare bigint[] := '{}';  -- rows whose state stays as it is
    r record;
    out_ids bigint[];
    out_stages text[];
    out_statuses text[];
    out_timeouts timestamptz[];
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(statuses)
       OR cardinality(ids) IS DISTINCT FROM cardinality(errors) THEN
        RAISE EXCEPTION 'ids, statuses and errors differ in length'
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(statuses) AS s(st)
                WHERE s.st IS NULL OR s.st NOT IN ('failed', 'timeout')) THEN
        RAISE EXCEPTION 'dispatch error status must be failed or timeout'
            USING ERRCODE = '22023';
    END IF;
    FOR pass IN 1..2 LOOP
        BEGIN
            WITH decision AS (
                SELECT w.workqueue_id AS id, u.st,
                       coalesce(u.err, 'dispatch error') AS err,
                       (s.retry_delay IS NOT NULL AND w.retries < s.max_retries) IS TRUE AS retry,
                       w.retries + 1 AS attempt, s.max_retries AS cap,
                       -- seconds: delay × 2^retries, capped, jittered, capped again
                       least(least(extract(epoch FROM s.retry_delay)::float8
                                       * power(2::float8, least(w.retries, 40)),
                                   coalesce(extract(epoch FROM s.retry_delay_max)::float8, 3e9),
                                   3e9)
                             * (0.8 + 0.4 * random()),
                             coalesce(extract(epoch FROM s.retry_delay_max)::float8, 3e9)) AS secs
                  FROM unnest(record_dispatch_error.ids, record_dispatch_error.statuses,
                              record_dispatch_error.errors) AS u(id, st, err)
                  JOIN pepsi.workqueue AS w ON w.workqueue_id = u.id
                  LEFT JOIN pepsi.stages AS s ON s.stage = w.stage
                 WHERE (w.status = 'running') IS TRUE  -- not the partial index: see v2
                   AND w.dispatcher_id = record_dispatch_error.dispatcher_id
            ), moved AS (
                UPDATE pepsi.workqueue AS w
                   SET status = CASE WHEN d.retry THEN 'paused' ELSE d.st END,
                       timeout = CASE WHEN d.retry THEN now() + make_interval(secs => d.secs) END,
                       dispatcher_id = NULL, updated_at = now(),
                       state = CASE WHEN w.workqueue_id = ANY (bare) THEN w.state
                                    WHEN d.retry
                                    THEN w.state || jsonb_build_object(
                                             'retry_error', d.err,
                                             'pause_reason', format('automatic retry %s of %s after: %s',
                                                                    d.attempt, d.cap, d.err))
                                    ELSE w.state || jsonb_build_object('dispatch_error', d.err) END
                  FROM decision AS d
                 WHERE w.workqueue_id = d.id
                   AND (w.status = 'running') IS TRUE
                   AND w.dispatcher_id = record_dispatch_error.dispatcher_id
                RETURNING w.workqueue_id, w.stage, w.status, w.timeout
            )
            SELECT array_agg(m.workqueue_id), array_agg(m.stage),
                   array_agg(m.status), array_agg(m.timeout)
              INTO out_ids, out_stages, out_statuses, out_timeouts
              FROM moved AS m;
            EXIT;
        EXCEPTION WHEN program_limit_exceeded THEN
            IF pass > 1 THEN
                RAISE;
            END IF;
        END;
        -- The slow path: which rows' new state cannot be built?  Only the
        -- expression, one block per row; nothing is written here.
        FOR r IN
            SELECT w.workqueue_id AS id, u.err, w.state,
                   (s.retry_delay IS NOT NULL AND w.retries < s.max_retries) IS TRUE AS retry,
                   w.retries + 1 AS attempt, s.max_retries AS cap
              FROM (SELECT DISTINCT ON (x.id) x.id, coalesce(x.err, 'dispatch error') AS err
                      FROM unnest(record_dispatch_error.ids, record_dispatch_error.errors)
                           AS x(id, err)
                     ORDER BY x.id) AS u
              JOIN pepsi.workqueue AS w ON w.workqueue_id = u.id
              LEFT JOIN pepsi.stages AS s ON s.stage = w.stage
             WHERE (w.status = 'running') IS TRUE
               AND w.dispatcher_id = record_dispatch_error.dispatcher_id
        LOOP
            BEGIN
                PERFORM CASE WHEN r.retry
                             THEN r.state || jsonb_build_object(
                                      'retry_error', r.err,
                                      'pause_reason', format('automatic retry %s of %s after: %s',
                                                             r.attempt, r.cap, r.err))
                             ELSE r.state || jsonb_build_object('dispatch_error', r.err) END;
            EXCEPTION WHEN OTHERS THEN
                bare := bare || r.id;
                RAISE WARNING 'record_dispatch_error: row % keeps its state without the note (%: %)',
                    r.id, SQLSTATE, SQLERRM;
            END;
        END LOOP;
    END LOOP;
    RETURN QUERY
    SELECT * FROM unnest(out_ids, out_stages, out_statuses, out_timeouts);
END
$$;

CREATE FUNCTION pepsi.register_dispatcher(hostname text, pid integer, competing boolean) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    new_id bigint;
BEGIN
    INSERT INTO pepsi.dispatchers AS d (hostname, pid, competing)
    VALUES (coalesce(register_dispatcher.hostname, ''), coalesce(register_dispatcher.pid, 0),
            coalesce(register_dispatcher.competing, false))
    RETURNING d.dispatcher_id INTO new_id;
    PERFORM pepsi._dispatcher_hold(new_id);
    RETURN new_id;
END
$$;

CREATE FUNCTION pepsi.register_schedules(names text[], stages text[], specs text[], next_ticks timestamp with time zone[]) RETURNS TABLE(name text, last_tick timestamp with time zone, settled_through timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $_$
#variable_conflict use_column
DECLARE
    n integer := coalesce(cardinality(register_schedules.names), 0);
BEGIN
    IF coalesce(cardinality(register_schedules.stages), 0) <> n
       OR coalesce(cardinality(register_schedules.specs), 0) <> n
       OR coalesce(cardinality(register_schedules.next_ticks), 0) <> n THEN
        RAISE EXCEPTION 'register_schedules: names, stages, specs and next_ticks differ in length'
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT FROM unnest(register_schedules.names) AS x
                WHERE x IS NULL OR x !~ '^[A-Za-z0-9_.-]+$') THEN
        RAISE EXCEPTION 'register_schedules: schedule names match [A-Za-z0-9_.-]+'
            USING ERRCODE = '22023';
    END IF;
    UPDATE pepsi.schedule_ticks AS t
       SET next_tick = NULL, updated_at = now()
     WHERE t.next_tick IS NOT NULL AND NOT (t.name = ANY (coalesce(register_schedules.names, '{}')));
    INSERT INTO pepsi.schedule_ticks AS t (name, stage, spec, next_tick, settled_through)
    SELECT u.name, u.stage, u.spec, u.next_tick, now()
      FROM unnest(register_schedules.names, register_schedules.stages, register_schedules.specs,
                  register_schedules.next_ticks) AS u(name, stage, spec, next_tick)
     ORDER BY u.name
    ON CONFLICT (name) DO UPDATE
       SET stage = excluded.stage, spec = excluded.spec, next_tick = excluded.next_tick,
           updated_at = now();
    RETURN QUERY
    SELECT t.name, t.last_tick, t.settled_through
      FROM pepsi.schedule_ticks AS t
     WHERE t.name = ANY (register_schedules.names)
     ORDER BY t.name;
END
$_$;

CREATE FUNCTION pepsi.register_stages(dispatcher_id bigint, stages text[], nexts text[], max_retries integer[], retry_delays interval[], retry_delay_maxes interval[], parallelisms integer[], queue_limits integer[]) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n integer := coalesce(cardinality(register_stages.stages), 0);
    bad text;
BEGIN
    IF coalesce(cardinality(register_stages.nexts), n) <> n
       OR coalesce(cardinality(register_stages.max_retries), n) <> n
       OR coalesce(cardinality(register_stages.retry_delays), n) <> n
       OR coalesce(cardinality(register_stages.retry_delay_maxes), n) <> n
       OR coalesce(cardinality(register_stages.parallelisms), n) <> n
       OR coalesce(cardinality(register_stages.queue_limits), n) <> n THEN
        RAISE EXCEPTION 'register_stages: arrays differ in length' USING ERRCODE = '22023';
    END IF;
    FOR bad IN SELECT s FROM unnest(register_stages.stages) AS s LOOP
        PERFORM pepsi._check_stage(bad);
    END LOOP;
    SELECT s INTO bad FROM unnest(register_stages.stages) AS s GROUP BY s HAVING count(*) > 1
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'register_stages: stage % given twice', bad USING ERRCODE = '22023';
    END IF;

    DELETE FROM pepsi.stages AS s
     WHERE NOT (s.stage = ANY (coalesce(register_stages.stages, '{}')));
    INSERT INTO pepsi.stages AS s (stage, next, max_retries, retry_delay, retry_delay_max,
                                   parallelism, queue_limit, updated_at, dispatcher_id)
    SELECT u.stage,
           coalesce(string_to_array(nullif(btrim(u.nxt), ''), ' '), '{}'),
           coalesce(u.mr, 10), u.rd, u.rdm, u.par, u.ql, now(),
           register_stages.dispatcher_id
      FROM unnest(register_stages.stages, register_stages.nexts, register_stages.max_retries,
                  register_stages.retry_delays, register_stages.retry_delay_maxes,
                  register_stages.parallelisms, register_stages.queue_limits)
           AS u(stage, nxt, mr, rd, rdm, par, ql)
    ON CONFLICT (stage) DO UPDATE
       SET next = EXCLUDED.next, max_retries = EXCLUDED.max_retries,
           retry_delay = EXCLUDED.retry_delay, retry_delay_max = EXCLUDED.retry_delay_max,
           parallelism = EXCLUDED.parallelism, queue_limit = EXCLUDED.queue_limit,
           updated_at = now(), dispatcher_id = EXCLUDED.dispatcher_id;
    RETURN n;
END
$$;

CREATE FUNCTION pepsi.registered_stages() RETURNS TABLE(stage text, next text[], max_retries integer, retry_delay interval, retry_delay_max interval, parallelism integer, queue_limit integer, updated_at timestamp with time zone, dispatcher_id bigint)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
    SELECT s.stage, s.next, s.max_retries, s.retry_delay, s.retry_delay_max,
           s.parallelism, s.queue_limit, s.updated_at, s.dispatcher_id
      FROM pepsi.stages AS s
     ORDER BY s.stage;
END
$$;

CREATE FUNCTION pepsi.release(dispatcher_id bigint, ids bigint[] DEFAULT NULL::bigint[]) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n integer;
BEGIN
    UPDATE pepsi.workqueue AS w
       SET status = 'pending', dispatcher_id = NULL, updated_at = now()
     WHERE w.status = 'running'
       AND w.dispatcher_id = release.dispatcher_id
       AND (release.ids IS NULL OR w.workqueue_id = ANY (release.ids));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

CREATE FUNCTION pepsi.replicas_away(dispatcher_id bigint, orphan_timeout interval) RETURNS TABLE(replica_id bigint, hostname text, pid integer)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
    SELECT d.dispatcher_id, d.hostname, d.pid
      FROM pepsi.dispatchers AS d
     WHERE d.dispatcher_id IS DISTINCT FROM replicas_away.dispatcher_id
       AND d.heartbeat_at >= now() - coalesce(replicas_away.orphan_timeout, interval '0')
       AND d.heartbeat_at <= greatest(pg_postmaster_start_time(),
                                      (SELECT b.stats_reset FROM pg_stat_bgwriter AS b),
                                      pg_last_xact_replay_timestamp())
       AND NOT pepsi._dispatcher_live(d.dispatcher_id)
     ORDER BY d.dispatcher_id
$$;

CREATE FUNCTION pepsi.requeue_due(stages text[], max_retries integer[], default_max_retries integer, expiry interval) RETURNS TABLE(requeued integer, exhausted integer, expired integer, next_due timestamp with time zone, exhausted_stages text[], exhausted_counts integer[], expired_stages text[], expired_counts integer[])
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    bare bigint[] := '{}';  -- rows whose state stays as it is
    r record;
BEGIN
  FOR pass IN 1..2 LOOP
   BEGIN
    WITH due AS MATERIALIZED (
        SELECT w.workqueue_id,
               (w.state ? 'delayed_until') AS is_delayed,
               (NOT (w.state ? 'delayed_until')
                AND requeue_due.expiry IS NOT NULL
                AND w.created_at < now() - requeue_due.expiry) AS is_expired,
               (NOT (w.state ? 'delayed_until')
                AND w.retries >= pepsi._retry_cap(w.stage, requeue_due.stages, requeue_due.max_retries,
                                          requeue_due.default_max_retries)) IS TRUE AS is_exhausted
          FROM pepsi.workqueue AS w
         WHERE w.status = 'paused' AND w.timeout <= now()
         ORDER BY w.timeout
         LIMIT 10000
           FOR UPDATE OF w SKIP LOCKED
    ), moved AS (
        UPDATE pepsi.workqueue AS w
           SET status = CASE WHEN due.is_expired THEN 'expired'
                             WHEN due.is_exhausted THEN 'failed'
                             ELSE 'pending' END,
               retries = CASE WHEN due.is_expired OR due.is_exhausted OR due.is_delayed
                                   THEN w.retries
                              ELSE w.retries + 1 END,
               state = CASE WHEN w.workqueue_id = ANY (bare) THEN w.state
                            WHEN due.is_expired
                                 THEN w.state || '{"dispatch_error": "expired"}'
                            WHEN due.is_exhausted
                                 THEN w.state || '{"dispatch_error": "retries exhausted"}'
                            ELSE w.state - 'delayed_until' - 'pause_reason' END,
               timeout = NULL,
               updated_at = now()
          FROM due
         WHERE w.workqueue_id = due.workqueue_id AND w.status = 'paused'
        RETURNING w.status AS new_status, w.stage
    ), per_stage AS (
        SELECT moved.new_status, moved.stage, count(*)::integer AS n
          FROM moved
         GROUP BY moved.new_status, moved.stage
    )
    SELECT coalesce(sum(p.n) FILTER (WHERE p.new_status = 'pending'), 0)::integer,
           coalesce(sum(p.n) FILTER (WHERE p.new_status = 'failed'), 0)::integer,
           coalesce(sum(p.n) FILTER (WHERE p.new_status = 'expired'), 0)::integer,
           coalesce(array_agg(p.stage ORDER BY p.stage)
                        FILTER (WHERE p.new_status = 'failed'), '{}'),
           coalesce(array_agg(p.n ORDER BY p.stage)
                        FILTER (WHERE p.new_status = 'failed'), '{}'),
           coalesce(array_agg(p.stage ORDER BY p.stage)
                        FILTER (WHERE p.new_status = 'expired'), '{}'),
           coalesce(array_agg(p.n ORDER BY p.stage)
                        FILTER (WHERE p.new_status = 'expired'), '{}')
      INTO requeued, exhausted, expired,
           exhausted_stages, exhausted_counts, expired_stages, expired_counts
      FROM per_stage AS p;
    EXIT;
   EXCEPTION WHEN program_limit_exceeded THEN
    IF pass > 1 THEN
        RAISE;
    END IF;
   END;
    -- The slow path: which due rows' note cannot be added?  The expression
    -- only, one block per row; nothing is written here.
    FOR r IN
        SELECT w.workqueue_id AS id, w.state,
               (requeue_due.expiry IS NOT NULL
                AND w.created_at < now() - requeue_due.expiry) AS is_expired
          FROM pepsi.workqueue AS w
         WHERE w.status = 'paused' AND w.timeout <= now()
           AND NOT (w.state ? 'delayed_until')
           AND ((requeue_due.expiry IS NOT NULL
                 AND w.created_at < now() - requeue_due.expiry)
                OR (w.retries >= pepsi._retry_cap(w.stage, requeue_due.stages,
                                              requeue_due.max_retries,
                                              requeue_due.default_max_retries)) IS TRUE)
         ORDER BY w.timeout
         LIMIT 10000
    LOOP
        BEGIN
            PERFORM r.state || CASE WHEN r.is_expired THEN '{"dispatch_error": "expired"}'::jsonb
                                    ELSE '{"dispatch_error": "retries exhausted"}'::jsonb END;
        EXCEPTION WHEN OTHERS THEN
            bare := bare || r.id;
            RAISE WARNING 'requeue_due: row % keeps its state without the dispatch_error (%: %)',
                r.id, SQLSTATE, SQLERRM;
        END;
    END LOOP;
  END LOOP;

    -- A new statement, so a new snapshot: the rows just moved are not paused.
    -- Finite timeouts only: a row paused until 'infinity' is never due.
    SELECT min(w.timeout) INTO next_due
      FROM pepsi.workqueue AS w
     WHERE w.status = 'paused' AND w.timeout < 'infinity'::timestamptz;
    RETURN NEXT;
END
$$;

CREATE FUNCTION pepsi.requeue_failed(stage text DEFAULT NULL::text, ids bigint[] DEFAULT NULL::bigint[]) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n integer := 0;
    moved integer;
    batch record;
BEGIN
    -- Kept rows live in dead_letters (keep_dead_letters): the selected ones
    -- come back into workqueue first, with their ids and status; a row that
    -- then stays failed (its key taken) is moved out again by the next
    -- keep_dead_letters.
    -- Only when there are such rows: the INSERT's statement trigger notifies
    -- even for no row, and a requeue that moves nothing says nothing.
    IF EXISTS (SELECT FROM pepsi.dead_letters AS d
                WHERE (requeue_failed.stage IS NULL OR d.stage = requeue_failed.stage)
                  AND (requeue_failed.ids IS NULL OR d.workqueue_id = ANY (requeue_failed.ids))) THEN
    WITH back AS (
        DELETE FROM pepsi.dead_letters AS d
         WHERE (requeue_failed.stage IS NULL OR d.stage = requeue_failed.stage)
           AND (requeue_failed.ids IS NULL OR d.workqueue_id = ANY (requeue_failed.ids))
        RETURNING d.workqueue_id, d.stage, d.status, d.payload, d.state, d.timeout, d.retries,
                  d.created_at, d.updated_at, d.dispatcher_id, d.priority, d.dedupe_key
    )
    INSERT INTO pepsi.workqueue
           (workqueue_id, stage, status, payload, state, timeout, retries, created_at,
            updated_at, dispatcher_id, priority, dedupe_key)
    OVERRIDING SYSTEM VALUE
    SELECT * FROM back;
    END IF;
    -- The rows without a key as one batch, then the lowest id of each key
    -- alone (a batch of one), so a key taken meanwhile costs only its row.
    FOR batch IN
        SELECT array_agg(w.workqueue_id) AS ids
          FROM pepsi.workqueue AS w
         WHERE w.status IN ('failed', 'timeout', 'expired') AND w.dedupe_key IS NULL
           AND (requeue_failed.stage IS NULL OR w.stage = requeue_failed.stage)
           AND (requeue_failed.ids IS NULL OR w.workqueue_id = ANY (requeue_failed.ids))
        UNION ALL
        SELECT ARRAY[k.workqueue_id]
          FROM (SELECT DISTINCT ON (w.dedupe_key) w.workqueue_id
                  FROM pepsi.workqueue AS w
                 WHERE w.status IN ('failed', 'timeout', 'expired') AND w.dedupe_key IS NOT NULL
                   AND (requeue_failed.stage IS NULL OR w.stage = requeue_failed.stage)
                   AND (requeue_failed.ids IS NULL OR w.workqueue_id = ANY (requeue_failed.ids))
                 ORDER BY w.dedupe_key, w.workqueue_id) AS k
    LOOP
        CONTINUE WHEN batch.ids IS NULL;
        BEGIN
            UPDATE pepsi.workqueue AS w
               SET status = 'pending', retries = 0, timeout = NULL, dispatcher_id = NULL,
                   updated_at = now(),
                   state = (w.state - 'error' - 'dispatch_error')
                           || jsonb_build_object('previous_error', jsonb_strip_nulls(jsonb_build_object(
                                  'status', w.status,
                                  'error', w.state -> 'error',
                                  'dispatch_error', w.state -> 'dispatch_error')))
             WHERE w.workqueue_id = ANY (batch.ids)
               AND w.status IN ('failed', 'timeout', 'expired')
               AND (w.dedupe_key IS NULL
                    OR NOT EXISTS (SELECT FROM pepsi.workqueue AS h
                                    WHERE h.dedupe_key = w.dedupe_key
                                      AND h.status IN ('pending', 'running', 'paused')));
            GET DIAGNOSTICS moved = ROW_COUNT;
            n := n + moved;
        EXCEPTION WHEN unique_violation THEN
            NULL;  -- the key was taken meanwhile: this row stays where it is
        END;
    END LOOP;
    IF n > 0 THEN
        PERFORM pg_notify('workqueue', '');
    END IF;
    RETURN n;
END
$$;

CREATE FUNCTION pepsi.requeue_matching(statuses text[] DEFAULT NULL::text[], in_stage text DEFAULT NULL::text, older_than interval DEFAULT NULL::interval, payload_contains jsonb DEFAULT NULL::jsonb, reason_group text DEFAULT NULL::text, before_id bigint DEFAULT NULL::bigint, dry_run boolean DEFAULT false) RETURNS TABLE(matched integer, acted integer, newest_id bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    ids bigint[];
BEGIN
    ids := pepsi._matching_ids('requeue', ARRAY['failed', 'timeout', 'expired'],
                               requeue_matching.statuses, requeue_matching.in_stage,
                               requeue_matching.older_than, requeue_matching.payload_contains,
                               requeue_matching.reason_group, requeue_matching.before_id);
    matched := cardinality(ids);
    newest_id := ids[matched];
    acted := 0;
    IF matched > 0 AND NOT coalesce(requeue_matching.dry_run, false) THEN
        acted := pepsi.requeue_failed(NULL, ids);
    END IF;
    RETURN NEXT;
END
$$;

CREATE FUNCTION pepsi.reschedule(id bigint, at timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    r record;
    due timestamptz := greatest(coalesce(reschedule.at, now()), now());
BEGIN
    IF reschedule.id IS NULL THEN
        RAISE EXCEPTION 'reschedule needs a message id' USING ERRCODE = '22004';
    END IF;
    IF NOT isfinite(reschedule.at) THEN
        RAISE EXCEPTION 'reschedule: the new due time must be finite (got %)', reschedule.at
            USING ERRCODE = '22008';
    END IF;
    -- No lock first: a running row is refused without waiting for its worker.
    SELECT w.status, w.stage INTO r
      FROM pepsi.workqueue AS w
     WHERE w.workqueue_id = reschedule.id;
    IF NOT FOUND THEN
        SELECT d.status, d.stage INTO r
          FROM pepsi.dead_letters AS d
         WHERE d.workqueue_id = reschedule.id;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'reschedule: no message %', reschedule.id USING ERRCODE = 'P0002';
    END IF;
    IF r.status IN ('pending', 'paused') THEN
        SELECT w.status, w.stage, w.state ? 'delayed_until' AS delayed INTO r
          FROM pepsi.workqueue AS w
         WHERE w.workqueue_id = reschedule.id
           FOR UPDATE;
        IF NOT FOUND THEN  -- moved to pepsi.dead_letters meanwhile: terminal
            SELECT d.status, d.stage INTO r
              FROM pepsi.dead_letters AS d
             WHERE d.workqueue_id = reschedule.id;
            IF NOT FOUND THEN  -- and purged
                RAISE EXCEPTION 'reschedule: no message %', reschedule.id
                    USING ERRCODE = 'P0002';
            END IF;
        END IF;
    END IF;
    IF r.status = 'running' THEN
        RAISE EXCEPTION 'reschedule: message % is running at stage %; only its stage can move it now',
                        reschedule.id, r.stage
            USING ERRCODE = '55000',
                  HINT = 'reschedule it once it is paused, or cancel it after its stage answered';
    ELSIF r.status = 'done' THEN
        RAISE EXCEPTION 'reschedule: message % is done (terminal); nothing is waiting to run',
                        reschedule.id
            USING ERRCODE = '55000',
                  HINT = 'enqueue a new message to run it again';
    ELSIF r.status NOT IN ('pending', 'paused') THEN
        RAISE EXCEPTION 'reschedule: message % is % (terminal); requeue it instead',
                        reschedule.id, r.status
            USING ERRCODE = '55000',
                  HINT = format('pepsi-queue requeue --id %s (pepsi.requeue_failed(ids => ARRAY[%s]))',
                                reschedule.id, reschedule.id);
    END IF;
    IF r.status = 'pending' THEN
        IF due <= now() THEN
            RETURN now();  -- already due
        END IF;
        UPDATE pepsi.workqueue AS w
           SET status = 'paused', timeout = due, updated_at = now(),
               state = w.state || jsonb_build_object('delayed_until', due)
         WHERE w.workqueue_id = reschedule.id;
    ELSE
        UPDATE pepsi.workqueue AS w
           SET timeout = due, updated_at = now(),
               state = CASE WHEN r.delayed THEN w.state || jsonb_build_object('delayed_until', due)
                            ELSE w.state END
         WHERE w.workqueue_id = reschedule.id;
    END IF;
    PERFORM pg_notify('workqueue', 'delayed');  -- the dispatcher learns the new due time
    RETURN due;
END
$$;

CREATE FUNCTION pepsi.reset_orphans(dispatcher_id bigint, competing boolean, orphan_timeout interval) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n integer;
BEGIN
    IF coalesce(reset_orphans.competing, false) THEN
        DELETE FROM pepsi.dispatchers AS d
         WHERE d.dispatcher_id IS DISTINCT FROM reset_orphans.dispatcher_id
           AND d.heartbeat_at < now() - coalesce(reset_orphans.orphan_timeout, interval '0');
        UPDATE pepsi.workqueue AS w
           SET status = 'pending', dispatcher_id = NULL, updated_at = now()
         WHERE w.workqueue_id IN (
                   SELECT o.workqueue_id
                     FROM pepsi.workqueue AS o
                    WHERE o.status = 'running'
                      AND o.dispatcher_id IS DISTINCT FROM reset_orphans.dispatcher_id
                      AND NOT EXISTS (SELECT 1 FROM pepsi.dispatchers AS d
                                       WHERE d.dispatcher_id = o.dispatcher_id)
                      FOR UPDATE SKIP LOCKED)
           AND w.status = 'running';
    ELSE
        DELETE FROM pepsi.dispatchers AS d
         WHERE d.dispatcher_id IS DISTINCT FROM reset_orphans.dispatcher_id;
        UPDATE pepsi.workqueue AS w
           SET status = 'pending', dispatcher_id = NULL, updated_at = now()
         WHERE w.status = 'running'
           AND w.dispatcher_id IS DISTINCT FROM reset_orphans.dispatcher_id;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

CREATE FUNCTION pepsi.schedules() RETURNS TABLE(name text, stage text, spec text, last_tick timestamp with time zone, next_tick timestamp with time zone, settled_through timestamp with time zone, updated_at timestamp with time zone)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
    SELECT t.name, t.stage, t.spec, t.last_tick, t.next_tick, t.settled_through, t.updated_at
      FROM pepsi.schedule_ticks AS t
     ORDER BY t.name
$$;

CREATE FUNCTION pepsi.schema_version() RETURNS text
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
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

CREATE FUNCTION pepsi.set_state(id bigint, from_stage text, patch jsonb, dispatcher_id bigint DEFAULT NULL::bigint) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
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

CREATE FUNCTION pepsi.stage_config() RETURNS TABLE(section text, option text, value text)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
    SELECT c.section, c.option, c.value
      FROM pepsi.config AS c
     WHERE lower(c.section) LIKE 'stage-%' OR lower(c.section) LIKE 'schedule-%'
     ORDER BY c.section, c.option;
END
$$;

CREATE FUNCTION pepsi.stage_health() RETURNS TABLE(stage text, state text, cause text, since timestamp with time zone, held_seconds double precision, pending bigint, dispatchers bigint)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
    WITH live AS (
        SELECT d.heartbeat_at, d.gauges -> 'stages' AS stages
          FROM pepsi.dispatchers AS d
         WHERE jsonb_typeof(d.gauges -> 'stages') = 'object'
           AND pepsi._dispatcher_live(d.dispatcher_id)
    ), reports AS (
        SELECT r.key AS stage,
               CASE WHEN r.value ->> 'state' IN ('serving', 'held_off', 'no_worker', 'paused')
                    THEN r.value ->> 'state' ELSE 'serving' END AS state,
               r.value ->> 'cause' AS cause,
               l.heartbeat_at - make_interval(secs => CASE
                   WHEN jsonb_typeof(r.value -> 'held_seconds') = 'number'
                   THEN (r.value ->> 'held_seconds')::float8 ELSE 0 END) AS since
          FROM live AS l
         CROSS JOIN LATERAL jsonb_each(l.stages) AS r
         WHERE jsonb_typeof(r.value) = 'object'
    ), worst AS (
        SELECT DISTINCT ON (r.stage) r.stage, r.state,
               CASE WHEN r.state IN ('held_off', 'no_worker') THEN r.cause END AS cause,
               CASE WHEN r.state IN ('held_off', 'no_worker') THEN r.since END AS since,
               count(*) OVER (PARTITION BY r.stage) AS n
          FROM reports AS r
         ORDER BY r.stage,
                  CASE r.state WHEN 'no_worker' THEN 0 WHEN 'held_off' THEN 1
                               WHEN 'paused' THEN 2 ELSE 3 END,
                  r.since
    ), names AS (
        SELECT s.stage FROM pepsi.stages AS s
        UNION SELECT w.stage FROM worst AS w
    )
    SELECT n.stage, coalesce(w.state, 'unknown'), w.cause, w.since,
           extract(epoch FROM now() - w.since)::float8,
           (SELECT count(*) FROM pepsi.workqueue AS q
             WHERE q.stage = n.stage AND q.status = 'pending'),
           coalesce(w.n, 0)
      FROM names AS n
      LEFT JOIN worst AS w ON w.stage = n.stage
     ORDER BY n.stage;
END
$$;

CREATE FUNCTION pepsi.stages_of(ids bigint[]) RETURNS TABLE(workqueue_id bigint, stage text)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
    SELECT w.workqueue_id, w.stage
      FROM pepsi.workqueue AS w
     WHERE w.workqueue_id = ANY (stages_of.ids)
     ORDER BY w.workqueue_id;
END
$$;

CREATE FUNCTION pepsi.unregister_dispatcher(dispatcher_id bigint) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pepsi', 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    UPDATE pepsi.workqueue AS w
       SET status = 'pending', dispatcher_id = NULL, updated_at = now()
     WHERE w.status = 'running'
       AND w.dispatcher_id = unregister_dispatcher.dispatcher_id;
    DELETE FROM pepsi.dispatchers AS d
     WHERE d.dispatcher_id = unregister_dispatcher.dispatcher_id;
END
$$;

CREATE TABLE pepsi.attempts (
    workqueue_id bigint NOT NULL,
    attempt integer NOT NULL,
    stage text NOT NULL,
    started_at timestamp with time zone,
    ended_at timestamp with time zone DEFAULT now() NOT NULL,
    outcome text NOT NULL,
    reason text,
    traceback text
);

CREATE TABLE pepsi.config (
    section text NOT NULL,
    option text NOT NULL,
    value text NOT NULL
);

CREATE TABLE pepsi.dead_letters (
    workqueue_id bigint NOT NULL,
    stage text NOT NULL,
    status text NOT NULL,
    payload jsonb NOT NULL,
    state jsonb NOT NULL,
    timeout timestamp with time zone,
    retries integer NOT NULL,
    created_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    dispatcher_id bigint,
    priority integer NOT NULL,
    dedupe_key text,
    kept_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT dead_letters_status_check CHECK ((status = ANY (ARRAY['failed'::text, 'timeout'::text, 'expired'::text])))
);

COMMENT ON TABLE pepsi.dead_letters IS 'kept failed, timeout and expired messages, moved out of workqueue (read pepsi.messages)';

CREATE TABLE pepsi.dispatch_stats (
    id boolean DEFAULT true NOT NULL,
    stage_runs bigint DEFAULT 0 NOT NULL,
    messages bigint DEFAULT 0 NOT NULL,
    failed bigint DEFAULT 0 NOT NULL,
    timeouts bigint DEFAULT 0 NOT NULL,
    crashes bigint DEFAULT 0 NOT NULL,
    requeued bigint DEFAULT 0 NOT NULL,
    expired bigint DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT dispatch_stats_one_row CHECK (id)
)
WITH (autovacuum_vacuum_threshold='0', autovacuum_vacuum_scale_factor='0');

CREATE TABLE pepsi.dispatchers (
    dispatcher_id bigint NOT NULL,
    hostname text NOT NULL,
    pid integer NOT NULL,
    competing boolean DEFAULT false NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    heartbeat_at timestamp with time zone DEFAULT now() NOT NULL,
    gauges jsonb
)
WITH (autovacuum_vacuum_threshold='0', autovacuum_vacuum_scale_factor='0');

ALTER TABLE pepsi.dispatchers ALTER COLUMN dispatcher_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME pepsi.dispatchers_dispatcher_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE pepsi.workqueue (
    workqueue_id bigint NOT NULL,
    stage text NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    state jsonb DEFAULT '{}'::jsonb NOT NULL,
    timeout timestamp with time zone,
    retries integer DEFAULT 0 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    dispatcher_id bigint,
    priority integer DEFAULT 0 NOT NULL,
    dedupe_key text,
    CONSTRAINT workqueue_paused_has_timeout CHECK (((status <> 'paused'::text) OR (timeout IS NOT NULL))),
    CONSTRAINT workqueue_retries_not_negative CHECK ((retries >= 0)),
    CONSTRAINT workqueue_running_iff_dispatcher CHECK (((status = 'running'::text) = (dispatcher_id IS NOT NULL))),
    CONSTRAINT workqueue_stage_name CHECK ((stage ~ '^[A-Za-z0-9_.-]+$'::text)),
    CONSTRAINT workqueue_status_known CHECK ((status = ANY (ARRAY['pending'::text, 'running'::text, 'paused'::text, 'done'::text, 'failed'::text, 'timeout'::text, 'expired'::text])))
)
WITH (autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_threshold='1000', autovacuum_vacuum_insert_scale_factor='0.05', autovacuum_analyze_scale_factor='0.02');

CREATE VIEW pepsi.messages AS
 SELECT w.workqueue_id,
    w.stage,
    w.status,
    w.payload,
    w.state,
    w.timeout,
    w.retries,
    w.created_at,
    w.updated_at,
    w.dispatcher_id,
    w.priority,
    w.dedupe_key
   FROM pepsi.workqueue w
UNION ALL
 SELECT d.workqueue_id,
    d.stage,
    d.status,
    d.payload,
    d.state,
    d.timeout,
    d.retries,
    d.created_at,
    d.updated_at,
    d.dispatcher_id,
    d.priority,
    d.dedupe_key
   FROM pepsi.dead_letters d;

COMMENT ON VIEW pepsi.messages IS 'every message: pepsi.workqueue and pepsi.dead_letters';

CREATE TABLE pepsi.schedule_ticks (
    name text NOT NULL,
    stage text,
    spec text,
    last_tick timestamp with time zone,
    settled_through timestamp with time zone NOT NULL,
    next_tick timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT schedule_ticks_name CHECK ((name ~ '^[A-Za-z0-9_.-]+$'::text))
)
WITH (autovacuum_vacuum_threshold='0', autovacuum_vacuum_scale_factor='0');

COMMENT ON TABLE pepsi.schedule_ticks IS 'known ticks of [schedule-NAME] sections: a tick is enqueued once, with its record';

CREATE TABLE pepsi.stage_stats (
    stage text NOT NULL,
    processed bigint DEFAULT 0 NOT NULL,
    failed bigint DEFAULT 0 NOT NULL,
    timeouts bigint DEFAULT 0 NOT NULL,
    crashes bigint DEFAULT 0 NOT NULL,
    processing_seconds double precision DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT stage_stats_stage_name CHECK ((stage ~ '^[A-Za-z0-9_.-]+$'::text))
)
WITH (autovacuum_vacuum_threshold='0', autovacuum_vacuum_scale_factor='0');

CREATE TABLE pepsi.stages (
    stage text NOT NULL,
    next text[] DEFAULT '{}'::text[] NOT NULL,
    max_retries integer DEFAULT 10 NOT NULL,
    retry_delay interval,
    retry_delay_max interval,
    parallelism integer,
    queue_limit integer,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    dispatcher_id bigint,
    CONSTRAINT stages_max_retries CHECK ((max_retries >= 0)),
    CONSTRAINT stages_retry_delay CHECK ((retry_delay > '00:00:00'::interval)),
    CONSTRAINT stages_retry_delay_max CHECK ((retry_delay_max > '00:00:00'::interval)),
    CONSTRAINT stages_stage_name CHECK ((stage ~ '^[A-Za-z0-9_.-]+$'::text))
)
WITH (autovacuum_vacuum_threshold='0', autovacuum_vacuum_scale_factor='0');

COMMENT ON TABLE pepsi.stages IS 'stage table of the running configuration, written by pepsi.register_stages';

CREATE TABLE pepsi.tracebacks (
    workqueue_id bigint NOT NULL,
    traceback text NOT NULL,
    noted_at timestamp with time zone DEFAULT now() NOT NULL
);

ALTER TABLE pepsi.workqueue ALTER COLUMN workqueue_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME pepsi.workqueue_workqueue_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

ALTER TABLE ONLY pepsi.attempts
    ADD CONSTRAINT attempts_pkey PRIMARY KEY (workqueue_id, attempt);

ALTER TABLE ONLY pepsi.config
    ADD CONSTRAINT config_pkey PRIMARY KEY (section, option);

ALTER TABLE ONLY pepsi.dead_letters
    ADD CONSTRAINT dead_letters_pkey PRIMARY KEY (workqueue_id);

ALTER TABLE ONLY pepsi.dispatch_stats
    ADD CONSTRAINT dispatch_stats_pkey PRIMARY KEY (id);

ALTER TABLE ONLY pepsi.dispatchers
    ADD CONSTRAINT dispatchers_pkey PRIMARY KEY (dispatcher_id);

ALTER TABLE ONLY pepsi.schedule_ticks
    ADD CONSTRAINT schedule_ticks_pkey PRIMARY KEY (name);

ALTER TABLE ONLY pepsi.stage_stats
    ADD CONSTRAINT stage_stats_pkey PRIMARY KEY (stage);

ALTER TABLE ONLY pepsi.stages
    ADD CONSTRAINT stages_pkey PRIMARY KEY (stage);

ALTER TABLE ONLY pepsi.tracebacks
    ADD CONSTRAINT tracebacks_pkey PRIMARY KEY (workqueue_id);

ALTER TABLE ONLY pepsi.workqueue
    ADD CONSTRAINT workqueue_pkey PRIMARY KEY (workqueue_id);

CREATE INDEX dead_letters_stage_idx ON pepsi.dead_letters USING btree (stage, workqueue_id);

CREATE UNIQUE INDEX workqueue_dedupe_idx ON pepsi.workqueue USING btree (dedupe_key) WHERE ((dedupe_key IS NOT NULL) AND (status = ANY (ARRAY['pending'::text, 'running'::text, 'paused'::text])));

CREATE INDEX workqueue_done_idx ON pepsi.workqueue USING btree (updated_at) WHERE (status = 'done'::text);

CREATE INDEX workqueue_failed_idx ON pepsi.workqueue USING btree (stage, workqueue_id) WHERE (status = ANY (ARRAY['failed'::text, 'timeout'::text, 'expired'::text]));

CREATE INDEX workqueue_paused_idx ON pepsi.workqueue USING btree (timeout) WHERE (status = 'paused'::text);

CREATE INDEX workqueue_pending_idx ON pepsi.workqueue USING btree (stage, priority DESC, workqueue_id) WHERE (status = 'pending'::text);

CREATE INDEX workqueue_running_idx ON pepsi.workqueue USING btree (dispatcher_id) WHERE (status = 'running'::text);

CREATE TRIGGER config_notify_change AFTER INSERT OR DELETE OR UPDATE ON pepsi.config FOR EACH STATEMENT EXECUTE FUNCTION pepsi._notify_config();

CREATE TRIGGER config_notify_truncate AFTER TRUNCATE ON pepsi.config FOR EACH STATEMENT EXECUTE FUNCTION pepsi._notify_config();

CREATE TRIGGER workqueue_attempts AFTER UPDATE OF status ON pepsi.workqueue FOR EACH ROW WHEN ((((old.status = 'running'::text) AND (new.status <> ALL (ARRAY['running'::text, 'done'::text])) AND (NOT ((new.status = 'pending'::text) AND (new.stage <> old.stage)))) OR ((old.status = ANY (ARRAY['pending'::text, 'paused'::text])) AND (new.status = ANY (ARRAY['failed'::text, 'timeout'::text, 'expired'::text]))))) EXECUTE FUNCTION pepsi._record_attempt();

CREATE TRIGGER workqueue_notify_insert AFTER INSERT ON pepsi.workqueue REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pepsi._notify_workqueue();

GRANT USAGE ON SCHEMA pepsi TO pepsi_operator;
GRANT USAGE ON SCHEMA pepsi TO pepsi_dispatcher;
GRANT USAGE ON SCHEMA pepsi TO pepsi_stage;
GRANT USAGE ON SCHEMA pepsi TO pepsi_ingress;
GRANT USAGE ON SCHEMA pepsi TO pepsi_dashboard;

REVOKE ALL ON FUNCTION pepsi._bad_line(line_number bigint, doc jsonb) FROM PUBLIC;

REVOKE ALL ON FUNCTION pepsi._check_payload(payload jsonb, what text) FROM PUBLIC;

REVOKE ALL ON FUNCTION pepsi._check_stage(stage text) FROM PUBLIC;

REVOKE ALL ON FUNCTION pepsi._dispatcher_hold(dispatcher_id bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION pepsi._dispatcher_live(dispatcher_id bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION pepsi._list_messages_sql(statuses text[], in_stage text, older_than interval, payload_contains jsonb, before_id bigint, max_rows integer, reason_group text, paused_stages text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION pepsi._list_messages_where(statuses text[], in_stage text, older_than interval, payload_contains jsonb, reason_group text, before_id bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION pepsi._live_stats() FROM PUBLIC;

REVOKE ALL ON FUNCTION pepsi._matching_ids(verb text, acts_on text[], statuses text[], in_stage text, older_than interval, payload_contains jsonb, reason_group text, before_id bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION pepsi._normalise_reason(reason text) FROM PUBLIC;

REVOKE ALL ON FUNCTION pepsi._notify_config() FROM PUBLIC;

REVOKE ALL ON FUNCTION pepsi._notify_workqueue() FROM PUBLIC;

REVOKE ALL ON FUNCTION pepsi._record_attempt() FROM PUBLIC;

REVOKE ALL ON FUNCTION pepsi._reserved_state_keys() FROM PUBLIC;

REVOKE ALL ON FUNCTION pepsi._retry_cap(stage text, stages text[], max_retries integer[], default_max_retries integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION pepsi.advance(id bigint, from_stage text, to_stage text, dispatcher_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.advance(id bigint, from_stage text, to_stage text, dispatcher_id bigint) TO pepsi_stage;

REVOKE ALL ON FUNCTION pepsi.advance_many(ids bigint[], from_stage text, to_stage text, dispatcher_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.advance_many(ids bigint[], from_stage text, to_stage text, dispatcher_id bigint) TO pepsi_stage;

REVOKE ALL ON FUNCTION pepsi.cancel(ids bigint[], stage text, all_rows boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.cancel(ids bigint[], stage text, all_rows boolean) TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.cancel(ids bigint[], stage text, all_rows boolean) TO pepsi_operator;

REVOKE ALL ON FUNCTION pepsi.cancel_matching(statuses text[], in_stage text, older_than interval, payload_contains jsonb, before_id bigint, dry_run boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.cancel_matching(statuses text[], in_stage text, older_than interval, payload_contains jsonb, before_id bigint, dry_run boolean) TO pepsi_operator;
GRANT ALL ON FUNCTION pepsi.cancel_matching(statuses text[], in_stage text, older_than interval, payload_contains jsonb, before_id bigint, dry_run boolean) TO pepsi_dashboard;

REVOKE ALL ON FUNCTION pepsi.check_answered(dispatcher_id bigint, ids bigint[]) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.check_answered(dispatcher_id bigint, ids bigint[]) TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.claim(dispatcher_id bigint, stages text[], caps integer[], skip_locked boolean, after_ids bigint[]) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.claim(dispatcher_id bigint, stages text[], caps integer[], skip_locked boolean, after_ids bigint[]) TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.claim_lines(dispatcher_id bigint, stages text[], caps integer[], skip_locked boolean, after_ids bigint[], line_limits integer[]) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.claim_lines(dispatcher_id bigint, stages text[], caps integer[], skip_locked boolean, after_ids bigint[], line_limits integer[]) TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.copied_ids(after bigint, copied bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.copied_ids(after bigint, copied bigint) TO pepsi_ingress;
GRANT ALL ON FUNCTION pepsi.copied_ids(after bigint, copied bigint) TO pepsi_stage;
GRANT ALL ON FUNCTION pepsi.copied_ids(after bigint, copied bigint) TO pepsi_operator;

REVOKE ALL ON FUNCTION pepsi.copy_mark() FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.copy_mark() TO pepsi_ingress;
GRANT ALL ON FUNCTION pepsi.copy_mark() TO pepsi_stage;
GRANT ALL ON FUNCTION pepsi.copy_mark() TO pepsi_operator;

REVOKE ALL ON FUNCTION pepsi.dashboard_cancel(ids bigint[]) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.dashboard_cancel(ids bigint[]) TO pepsi_dashboard;

REVOKE ALL ON FUNCTION pepsi.dashboard_failed(reason text, in_stage text, max_rows integer) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.dashboard_failed(reason text, in_stage text, max_rows integer) TO pepsi_dashboard;

REVOKE ALL ON FUNCTION pepsi.dashboard_message(id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.dashboard_message(id bigint) TO pepsi_dashboard;

REVOKE ALL ON FUNCTION pepsi.dashboard_requeue(ids bigint[]) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.dashboard_requeue(ids bigint[]) TO pepsi_dashboard;

REVOKE ALL ON FUNCTION pepsi.dashboard_reschedule(id bigint, at timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.dashboard_reschedule(id bigint, at timestamp with time zone) TO pepsi_dashboard;

REVOKE ALL ON FUNCTION pepsi.dashboard_schedules() FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.dashboard_schedules() TO pepsi_dashboard;

REVOKE ALL ON FUNCTION pepsi.dashboard_snapshot(live_within interval) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.dashboard_snapshot(live_within interval) TO pepsi_dashboard;

REVOKE ALL ON FUNCTION pepsi.dispatcher_registered(dispatcher_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.dispatcher_registered(dispatcher_id bigint) TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.enqueue(stage text, payload jsonb, not_before timestamp with time zone, priority integer, dedupe_key text) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.enqueue(stage text, payload jsonb, not_before timestamp with time zone, priority integer, dedupe_key text) TO pepsi_ingress;
GRANT ALL ON FUNCTION pepsi.enqueue(stage text, payload jsonb, not_before timestamp with time zone, priority integer, dedupe_key text) TO pepsi_stage;
GRANT ALL ON FUNCTION pepsi.enqueue(stage text, payload jsonb, not_before timestamp with time zone, priority integer, dedupe_key text) TO pepsi_operator;

REVOKE ALL ON FUNCTION pepsi.enqueue_lines(stage text, lines text[], not_before timestamp with time zone, priority integer, dedupe_keys text[], key_field text, first_line bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.enqueue_lines(stage text, lines text[], not_before timestamp with time zone, priority integer, dedupe_keys text[], key_field text, first_line bigint) TO pepsi_ingress;
GRANT ALL ON FUNCTION pepsi.enqueue_lines(stage text, lines text[], not_before timestamp with time zone, priority integer, dedupe_keys text[], key_field text, first_line bigint) TO pepsi_stage;
GRANT ALL ON FUNCTION pepsi.enqueue_lines(stage text, lines text[], not_before timestamp with time zone, priority integer, dedupe_keys text[], key_field text, first_line bigint) TO pepsi_operator;

REVOKE ALL ON FUNCTION pepsi.enqueue_many(stage text, payloads jsonb[], not_before timestamp with time zone, priority integer, dedupe_keys text[]) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.enqueue_many(stage text, payloads jsonb[], not_before timestamp with time zone, priority integer, dedupe_keys text[]) TO pepsi_ingress;
GRANT ALL ON FUNCTION pepsi.enqueue_many(stage text, payloads jsonb[], not_before timestamp with time zone, priority integer, dedupe_keys text[]) TO pepsi_stage;
GRANT ALL ON FUNCTION pepsi.enqueue_many(stage text, payloads jsonb[], not_before timestamp with time zone, priority integer, dedupe_keys text[]) TO pepsi_operator;

REVOKE ALL ON FUNCTION pepsi.fail(id bigint, from_stage text, reason text, dispatcher_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.fail(id bigint, from_stage text, reason text, dispatcher_id bigint) TO pepsi_stage;

REVOKE ALL ON FUNCTION pepsi.failed_messages(in_stage text, max_rows integer, in_reason text) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.failed_messages(in_stage text, max_rows integer, in_reason text) TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.failed_messages(in_stage text, max_rows integer, in_reason text) TO pepsi_operator;
GRANT ALL ON FUNCTION pepsi.failed_messages(in_stage text, max_rows integer, in_reason text) TO pepsi_dashboard;

REVOKE ALL ON FUNCTION pepsi.failed_reasons(in_stage text) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.failed_reasons(in_stage text) TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.failed_reasons(in_stage text) TO pepsi_operator;
GRANT ALL ON FUNCTION pepsi.failed_reasons(in_stage text) TO pepsi_dashboard;

REVOKE ALL ON FUNCTION pepsi.finish(id bigint, from_stage text, dispatcher_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.finish(id bigint, from_stage text, dispatcher_id bigint) TO pepsi_stage;

REVOKE ALL ON FUNCTION pepsi.finish_many(ids bigint[], from_stage text, dispatcher_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.finish_many(ids bigint[], from_stage text, dispatcher_id bigint) TO pepsi_stage;

REVOKE ALL ON FUNCTION pepsi.fire_schedule(name text, ticks timestamp with time zone[], stage text, payload jsonb, priority integer, dedupe_key text, next_tick timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.fire_schedule(name text, ticks timestamp with time zone[], stage text, payload jsonb, priority integer, dedupe_key text, next_tick timestamp with time zone) TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.flush_stats(stages text[], processed bigint[], failed bigint[], timeouts bigint[], crashes bigint[], seconds double precision[], stage_runs bigint, messages bigint, requeued bigint, expired bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.flush_stats(stages text[], processed bigint[], failed bigint[], timeouts bigint[], crashes bigint[], seconds double precision[], stage_runs bigint, messages bigint, requeued bigint, expired bigint) TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.get_message(id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.get_message(id bigint) TO pepsi_stage;
GRANT ALL ON FUNCTION pepsi.get_message(id bigint) TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.get_message(id bigint) TO pepsi_operator;

REVOKE ALL ON FUNCTION pepsi.get_messages(ids bigint[]) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.get_messages(ids bigint[]) TO pepsi_stage;
GRANT ALL ON FUNCTION pepsi.get_messages(ids bigint[]) TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.get_messages(ids bigint[]) TO pepsi_operator;

REVOKE ALL ON FUNCTION pepsi.heartbeat(dispatcher_id bigint, gauges jsonb) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.heartbeat(dispatcher_id bigint, gauges jsonb) TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.held_ids(dispatcher_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.held_ids(dispatcher_id bigint) TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.hop(id bigint, from_stage text, to_stage text, dispatcher_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.hop(id bigint, from_stage text, to_stage text, dispatcher_id bigint) TO pepsi_stage;

REVOKE ALL ON FUNCTION pepsi.keep_dead_letters(batch_size integer) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.keep_dead_letters(batch_size integer) TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.key_holders(keys text[]) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.key_holders(keys text[]) TO pepsi_ingress;
GRANT ALL ON FUNCTION pepsi.key_holders(keys text[]) TO pepsi_stage;
GRANT ALL ON FUNCTION pepsi.key_holders(keys text[]) TO pepsi_operator;

REVOKE ALL ON FUNCTION pepsi.list_messages(statuses text[], in_stage text, older_than interval, payload_contains jsonb, before_id bigint, max_rows integer, reason_group text) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.list_messages(statuses text[], in_stage text, older_than interval, payload_contains jsonb, before_id bigint, max_rows integer, reason_group text) TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.list_messages(statuses text[], in_stage text, older_than interval, payload_contains jsonb, before_id bigint, max_rows integer, reason_group text) TO pepsi_operator;
GRANT ALL ON FUNCTION pepsi.list_messages(statuses text[], in_stage text, older_than interval, payload_contains jsonb, before_id bigint, max_rows integer, reason_group text) TO pepsi_dashboard;

REVOKE ALL ON FUNCTION pepsi.message_history(id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.message_history(id bigint) TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.message_history(id bigint) TO pepsi_operator;
GRANT ALL ON FUNCTION pepsi.message_history(id bigint) TO pepsi_dashboard;

REVOKE ALL ON FUNCTION pepsi.message_story(id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.message_story(id bigint) TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.message_story(id bigint) TO pepsi_operator;
GRANT ALL ON FUNCTION pepsi.message_story(id bigint) TO pepsi_dashboard;

REVOKE ALL ON FUNCTION pepsi.metrics() FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.metrics() TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.metrics() TO pepsi_operator;
GRANT ALL ON FUNCTION pepsi.metrics() TO pepsi_dashboard;

REVOKE ALL ON FUNCTION pepsi.note_traceback(id bigint, from_stage text, traceback text, dispatcher_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.note_traceback(id bigint, from_stage text, traceback text, dispatcher_id bigint) TO pepsi_stage;

REVOKE ALL ON FUNCTION pepsi.pause(id bigint, from_stage text, until timestamp with time zone, reason text, dispatcher_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.pause(id bigint, from_stage text, until timestamp with time zone, reason text, dispatcher_id bigint) TO pepsi_stage;

REVOKE ALL ON FUNCTION pepsi.pause_stage(stage text, paused boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.pause_stage(stage text, paused boolean) TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.pause_stage(stage text, paused boolean) TO pepsi_operator;
GRANT ALL ON FUNCTION pepsi.pause_stage(stage text, paused boolean) TO pepsi_dashboard;

REVOKE ALL ON FUNCTION pepsi.pin_messages(ids bigint[], dispatcher_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.pin_messages(ids bigint[], dispatcher_id bigint) TO pepsi_stage;

REVOKE ALL ON FUNCTION pepsi.purge(statuses text[], stage text, older_than interval, dry_run boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.purge(statuses text[], stage text, older_than interval, dry_run boolean) TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.purge(statuses text[], stage text, older_than interval, dry_run boolean) TO pepsi_operator;

REVOKE ALL ON FUNCTION pepsi.purge_done(retention interval, batch_size integer) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.purge_done(retention interval, batch_size integer) TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.queue_counts() FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.queue_counts() TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.queue_counts() TO pepsi_operator;

REVOKE ALL ON FUNCTION pepsi.queue_dispatchers() FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.queue_dispatchers() TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.queue_dispatchers() TO pepsi_operator;

REVOKE ALL ON FUNCTION pepsi.queue_overview() FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.queue_overview() TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.queue_overview() TO pepsi_operator;

REVOKE ALL ON FUNCTION pepsi.record_dispatch_error(dispatcher_id bigint, ids bigint[], statuses text[], errors text[]) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.record_dispatch_error(dispatcher_id bigint, ids bigint[], statuses text[], errors text[]) TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.register_dispatcher(hostname text, pid integer, competing boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.register_dispatcher(hostname text, pid integer, competing boolean) TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.register_schedules(names text[], stages text[], specs text[], next_ticks timestamp with time zone[]) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.register_schedules(names text[], stages text[], specs text[], next_ticks timestamp with time zone[]) TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.register_stages(dispatcher_id bigint, stages text[], nexts text[], max_retries integer[], retry_delays interval[], retry_delay_maxes interval[], parallelisms integer[], queue_limits integer[]) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.register_stages(dispatcher_id bigint, stages text[], nexts text[], max_retries integer[], retry_delays interval[], retry_delay_maxes interval[], parallelisms integer[], queue_limits integer[]) TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.registered_stages() FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.registered_stages() TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.registered_stages() TO pepsi_ingress;
GRANT ALL ON FUNCTION pepsi.registered_stages() TO pepsi_stage;
GRANT ALL ON FUNCTION pepsi.registered_stages() TO pepsi_operator;

REVOKE ALL ON FUNCTION pepsi.release(dispatcher_id bigint, ids bigint[]) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.release(dispatcher_id bigint, ids bigint[]) TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.replicas_away(dispatcher_id bigint, orphan_timeout interval) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.replicas_away(dispatcher_id bigint, orphan_timeout interval) TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.requeue_due(stages text[], max_retries integer[], default_max_retries integer, expiry interval) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.requeue_due(stages text[], max_retries integer[], default_max_retries integer, expiry interval) TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.requeue_failed(stage text, ids bigint[]) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.requeue_failed(stage text, ids bigint[]) TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.requeue_failed(stage text, ids bigint[]) TO pepsi_operator;

REVOKE ALL ON FUNCTION pepsi.requeue_matching(statuses text[], in_stage text, older_than interval, payload_contains jsonb, reason_group text, before_id bigint, dry_run boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.requeue_matching(statuses text[], in_stage text, older_than interval, payload_contains jsonb, reason_group text, before_id bigint, dry_run boolean) TO pepsi_operator;
GRANT ALL ON FUNCTION pepsi.requeue_matching(statuses text[], in_stage text, older_than interval, payload_contains jsonb, reason_group text, before_id bigint, dry_run boolean) TO pepsi_dashboard;

REVOKE ALL ON FUNCTION pepsi.reschedule(id bigint, at timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.reschedule(id bigint, at timestamp with time zone) TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.reschedule(id bigint, at timestamp with time zone) TO pepsi_operator;

REVOKE ALL ON FUNCTION pepsi.reset_orphans(dispatcher_id bigint, competing boolean, orphan_timeout interval) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.reset_orphans(dispatcher_id bigint, competing boolean, orphan_timeout interval) TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.schedules() FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.schedules() TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.schedules() TO pepsi_operator;

REVOKE ALL ON FUNCTION pepsi.schema_version() FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.schema_version() TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.schema_version() TO pepsi_stage;
GRANT ALL ON FUNCTION pepsi.schema_version() TO pepsi_ingress;
GRANT ALL ON FUNCTION pepsi.schema_version() TO pepsi_dashboard;
GRANT ALL ON FUNCTION pepsi.schema_version() TO pepsi_operator;

REVOKE ALL ON FUNCTION pepsi.set_state(id bigint, from_stage text, patch jsonb, dispatcher_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.set_state(id bigint, from_stage text, patch jsonb, dispatcher_id bigint) TO pepsi_stage;

REVOKE ALL ON FUNCTION pepsi.stage_config() FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.stage_config() TO pepsi_stage;
GRANT ALL ON FUNCTION pepsi.stage_config() TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.stage_health() FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.stage_health() TO pepsi_dispatcher;
GRANT ALL ON FUNCTION pepsi.stage_health() TO pepsi_operator;

REVOKE ALL ON FUNCTION pepsi.stages_of(ids bigint[]) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.stages_of(ids bigint[]) TO pepsi_dispatcher;

REVOKE ALL ON FUNCTION pepsi.unregister_dispatcher(dispatcher_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION pepsi.unregister_dispatcher(dispatcher_id bigint) TO pepsi_dispatcher;

GRANT SELECT ON TABLE pepsi.attempts TO pepsi_dispatcher;
GRANT SELECT ON TABLE pepsi.attempts TO pepsi_operator;

GRANT SELECT ON TABLE pepsi.config TO pepsi_dispatcher;

GRANT SELECT ON TABLE pepsi.dead_letters TO pepsi_dispatcher;
GRANT SELECT ON TABLE pepsi.dead_letters TO pepsi_operator;

GRANT SELECT ON TABLE pepsi.dispatch_stats TO pepsi_dispatcher;
GRANT SELECT ON TABLE pepsi.dispatch_stats TO pepsi_operator;

GRANT SELECT ON TABLE pepsi.dispatchers TO pepsi_dispatcher;
GRANT SELECT ON TABLE pepsi.dispatchers TO pepsi_operator;

GRANT SELECT ON TABLE pepsi.workqueue TO pepsi_dispatcher;
GRANT SELECT ON TABLE pepsi.workqueue TO pepsi_operator;

GRANT INSERT(stage) ON TABLE pepsi.workqueue TO pepsi_ingress;
GRANT INSERT(stage) ON TABLE pepsi.workqueue TO pepsi_stage;
GRANT INSERT(stage) ON TABLE pepsi.workqueue TO pepsi_operator;

GRANT INSERT(payload) ON TABLE pepsi.workqueue TO pepsi_ingress;
GRANT INSERT(payload) ON TABLE pepsi.workqueue TO pepsi_stage;
GRANT INSERT(payload) ON TABLE pepsi.workqueue TO pepsi_operator;

GRANT INSERT(priority) ON TABLE pepsi.workqueue TO pepsi_ingress;
GRANT INSERT(priority) ON TABLE pepsi.workqueue TO pepsi_stage;
GRANT INSERT(priority) ON TABLE pepsi.workqueue TO pepsi_operator;

GRANT INSERT(dedupe_key) ON TABLE pepsi.workqueue TO pepsi_ingress;
GRANT INSERT(dedupe_key) ON TABLE pepsi.workqueue TO pepsi_stage;
GRANT INSERT(dedupe_key) ON TABLE pepsi.workqueue TO pepsi_operator;

GRANT SELECT ON TABLE pepsi.messages TO pepsi_dispatcher;
GRANT SELECT ON TABLE pepsi.messages TO pepsi_operator;

GRANT SELECT ON TABLE pepsi.schedule_ticks TO pepsi_dispatcher;
GRANT SELECT ON TABLE pepsi.schedule_ticks TO pepsi_operator;

GRANT SELECT ON TABLE pepsi.stage_stats TO pepsi_dispatcher;
GRANT SELECT ON TABLE pepsi.stage_stats TO pepsi_operator;

GRANT SELECT ON TABLE pepsi.stages TO pepsi_dispatcher;
GRANT SELECT ON TABLE pepsi.stages TO pepsi_operator;

GRANT SELECT ON TABLE pepsi.tracebacks TO pepsi_dispatcher;
