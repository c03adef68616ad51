-- pepsi.enqueue_lines(stage text, lines text[], not_before timestamptz default null,
--                     priority integer default 0, dedupe_keys text[] default null,
--                     key_field text default null, first_line bigint default 1)
--   → setof bigint
--   The bulk path of pepsi-queue enqueue STAGE - and of the Python
--   enqueue_many: one message per element of lines, each the TEXT of one
--   JSON object (a JSON line), parsed here in one set-based INSERT ...
--   SELECT (no jsonb[] literal to build, send and parse).  Element i is
--   "line first_line + i - 1"; an element NULL or only whitespace is a blank
--   line: skipped, no message, no id.  Returns one id per non-blank element,
--   in array order; ids of the rows a call inserts ascend in that order.
--   not_before and priority as in pepsi.enqueue, for every row of the call.
--   dedupe_keys: NULL, or aligned with lines (a NULL element: no key);
--   key_field instead takes each message's key from its payload's member of
--   that name (->>: a number becomes its text; absent or null: no key); not
--   both.  Keys behave exactly as in enqueue_many: a key a pending, running
--   or paused message carries inserts nothing and returns that message's id;
--   an element whose key an earlier element took returns that element's id;
--   concurrent callers with one key get one id.
--   All or nothing per call: a line that is not JSON raises 22P02, a line
--   with a number jsonb cannot hold (1e999999) 22003, a line too large or
--   too deeply nested for jsonb 54000 or 54001, a line that is not a JSON
--   object 22023, a bad key 22023 -- each naming the FIRST such line by
--   number with a hint how to fix it -- and nothing of the call is
--   inserted (the caller's transaction decides about earlier calls).  22023 also for a NULL or malformed stage, dedupe_keys not
--   aligned with lines, both dedupe_keys and key_field; 22008 for a
--   non-finite not_before.
--   Cost: one INSERT of all rows without keys (one NOTIFY 'workqueue' by the
--   table's statement trigger); with keys one look-up of the holders, then
--   one INSERT of the rest; again once more when two lines of the call share
--   a key or a concurrent producer committed one of the keys in between (the
--   INSERT's 23505 undoes that round; a second 23505 under REPEATABLE READ
--   or SERIALIZABLE raises 40001, as enqueue's ON CONFLICT would).  Arrays are only unnested, never
--   subscripted per row.  enable_seqscan off: the holders' look-up must use
--   workqueue_dedupe_idx even when the statistics say the queue is empty
--   (a sequential scan per key made 100,000 keyed lines take minutes);
--   plan_cache_mode force_custom_plan: each statement is planned with the
--   call's arrays, whose sizes the planner then knows (a generic plan
--   guessed 10 rows and joined 20,000 keys to 20,000 rows by nested loop).
--   Writes: pepsi.workqueue (delayed rows: also NOTIFY 'workqueue',
--   'delayed', as enqueue).  Locks: none beyond the insert and the keys'
--   index entries.
--   Callers: pepsi_ingress, pepsi_stage, pepsi_operator (SECURITY DEFINER;
--   pepsi-queue enqueue, pepsi_dispatch.enqueue.enqueue_many).
CREATE OR REPLACE FUNCTION pepsi.enqueue_lines(stage text, lines text[],
                                               not_before timestamptz DEFAULT NULL,
                                               priority integer DEFAULT 0,
                                               dedupe_keys text[] DEFAULT NULL,
                                               key_field text DEFAULT NULL,
                                               first_line bigint DEFAULT 1)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
SET enable_seqscan = off
SET plan_cache_mode = force_custom_plan
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
