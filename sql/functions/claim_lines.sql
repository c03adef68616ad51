-- pepsi.claim_lines(dispatcher_id bigint, stages text[], caps int[],
--                   skip_locked boolean default false, after_ids bigint[] default NULL,
--                   line_limits integer[] default NULL)
--   → table(workqueue_id bigint, stage text, priority integer, line text)
--   The claim (pepsi.claim is a wrapper of this function: the pick, the
--   order, the floors, the errors, the writes, the locks and the guarantees
--   of claim.sql's header all hold here), and with each claimed row, the line
--   a worker that takes rows on its pipe reads instead of the bare id:
--       ID <TAB> STAGE <TAB> RETRIES <TAB> PAYLOAD <TAB> STATE
--   PAYLOAD and STATE in jsonb's text form, which never holds a tab or a
--   newline (jsonb escapes every control character inside strings); STAGE is
--   a stage name (letters, digits, '_', '.', '-').  The line is made from the
--   row the UPDATE wrote (RETURNING): the row as claimed.  The worker then
--   needs no pepsi.get_messages round trip for it.
--   The pick always passes over rows another session has locked (FOR UPDATE
--   SKIP LOCKED): an operator's open cancel, an application's SELECT ... FOR
--   UPDATE or another replica's claim never makes it wait.  skip_locked is
--   accepted for the callers of earlier revisions and changes nothing.
--   line_limits: when not NULL, aligned with stages: the longest line (bytes)
--   returned for a row of stages[i].  A row's line is rendered only when its
--   stage's limit is above 0 and its payload and state take at most 64 KiB
--   stored; NULL or 0 there, or a longer line: line is NULL (the worker is
--   sent the bare id and reads the row itself).  line_limits NULL: every
--   line is NULL, nothing is rendered.
--   Raises 22023 also when a non-NULL line_limits and stages differ in length.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.claim_lines(dispatcher_id bigint, stages text[], caps integer[],
                                             skip_locked boolean DEFAULT false,
                                             after_ids bigint[] DEFAULT NULL,
                                             line_limits integer[] DEFAULT NULL)
RETURNS TABLE (workqueue_id bigint, stage text, priority integer, line text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_sort = off
SET jit = off
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
