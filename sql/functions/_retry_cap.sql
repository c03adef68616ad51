-- pepsi._retry_cap(stage text, stages text[], max_retries int[], default_max_retries int)
--   → integer: how many retries a paused row of `stage` may have had and still
--   be flipped back to pending (requeue_due's cap; NULL: no cap).
--   stages NULL: the stage registry's MAX_RETRIES for `stage`
--   (pepsi.stages.max_retries), else default_max_retries, else 10 (the
--   registry's own default).  stages given: max_retries[i] for stages[i],
--   else default_max_retries.
--   Reads: pepsi.stages by its primary key.  STABLE.
--   Callers: granted to nobody (requeue_due and record_dispatch_error call it).
CREATE OR REPLACE FUNCTION pepsi._retry_cap(stage text, stages text[], max_retries integer[],
                                            default_max_retries integer)
RETURNS integer
LANGUAGE sql STABLE
SET search_path = pepsi, pg_catalog, pg_temp
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
