-- pepsi.requeue_due: the retry policy for paused rows whose time has come.
BEGIN;
SELECT plan(22);

CREATE FUNCTION pg_temp.paused(s text, retries int, due interval, age interval)
RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO pepsi.workqueue (stage, status, timeout, retries, created_at)
    VALUES (s, 'paused', now() + due, retries, now() - age) RETURNING workqueue_id $$;

SELECT pg_temp.paused('a', 0, '-1 s', '1 h')    AS retry,
       pg_temp.paused('a', 2, '-1 s', '1 h')    AS exhausted,
       pg_temp.paused('z', 5, '-1 s', '1 h')    AS dflt_retry,
       pg_temp.paused('z', 10, '-1 s', '1 h')   AS dflt_exhausted,
       pg_temp.paused('a', 2, '-1 s', '2 days') AS old,
       pg_temp.paused('a', 0, '0 s', '1 h')     AS due_now,
       pg_temp.paused('a', 0, '1 h', '1 h')     AS later,
       pg_temp.paused('a', 0, '2 h', '3 days')  AS old_not_due
\gset

SELECT results_eq(
    $$SELECT * FROM pepsi.requeue_due(ARRAY['a', 'b'], ARRAY[2, 7], 10, interval '1 day')$$,
    $$VALUES (3, 2, 1, now() + interval '1 h', ARRAY['a', 'z'], ARRAY[1, 1], ARRAY['a'], ARRAY[1])$$,
    'counts requeued, exhausted, expired (in total and per stage) and returns the next due time');
SELECT results_eq(format('SELECT status, retries, timeout FROM pepsi.workqueue WHERE workqueue_id = %s', :retry),
    $$VALUES ('pending'::text, 1, NULL::timestamptz)$$,
    'a due row below its cap goes pending with retries + 1 and no timeout');
SELECT results_eq(format('SELECT status, retries FROM pepsi.workqueue WHERE workqueue_id = %s', :due_now),
    $$VALUES ('pending'::text, 1)$$, 'a row due exactly now is due');
SELECT results_eq(format('SELECT status, retries, state->>''dispatch_error'', timeout FROM pepsi.workqueue WHERE workqueue_id = %s', :exhausted),
    $$VALUES ('failed'::text, 2, 'retries exhausted'::text, NULL::timestamptz)$$,
    'a due row whose retries reached its stage''s max fails: retries exhausted');
SELECT results_eq(format('SELECT status, retries FROM pepsi.workqueue WHERE workqueue_id = %s', :dflt_retry),
    $$VALUES ('pending'::text, 6)$$, 'a stage not in the arrays uses the default max (below it)');
SELECT results_eq(format('SELECT status, state->>''dispatch_error'' FROM pepsi.workqueue WHERE workqueue_id = %s', :dflt_exhausted),
    $$VALUES ('failed'::text, 'retries exhausted'::text)$$,
    'a stage not in the arrays uses the default max (reached)');
SELECT results_eq(format('SELECT status, state->>''dispatch_error'' FROM pepsi.workqueue WHERE workqueue_id = %s', :old),
    $$VALUES ('expired'::text, 'expired'::text)$$,
    'a due row older than expiry expires (expiry wins over exhaustion)');
SELECT results_eq(format('SELECT status, timeout FROM pepsi.workqueue WHERE workqueue_id = %s', :later),
    $$VALUES ('paused'::text, now() + interval '1 h')$$, 'a row not yet due stays paused');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :old_not_due), 'paused',
          'an old row that is not due yet is left for later');

SELECT results_eq(
    $$SELECT * FROM pepsi.requeue_due(ARRAY['a'], ARRAY[2], 10, interval '1 day')$$,
    $$VALUES (0, 0, 0, now() + interval '1 h', '{}'::text[], '{}'::int[], '{}'::text[], '{}'::int[])$$,
    'a second call finds nothing due and still reports the next due time');

UPDATE pepsi.workqueue SET timeout = now() - interval '1 s'
 WHERE workqueue_id IN (:later, :old_not_due);
SELECT results_eq(
    $$SELECT * FROM pepsi.requeue_due(ARRAY['a'], ARRAY[2], NULL, NULL)$$,
    $$VALUES (2, 0, 0, NULL::timestamptz, '{}'::text[], '{}'::int[], '{}'::text[], '{}'::int[])$$,
    'NULL expiry expires nothing; next_due is NULL when no row is paused');
SELECT is((SELECT retries FROM pepsi.workqueue WHERE workqueue_id = :old_not_due), 1,
          'the old row was requeued since nothing expires');

-- No cap at all: default NULL and the stage not listed.  (Stages NULL, what
-- the dispatcher passes, means the stage registry's caps: requeue_due_registry_policy.sql.)
SELECT pg_temp.paused('q', 1000, '-1 s', '1 h') AS nocap \gset
SELECT results_eq(
    $$SELECT requeued, exhausted FROM pepsi.requeue_due('{}', '{}', NULL, NULL)$$,
    $$VALUES (1, 0)$$, 'with no max at all a row is always requeued');

-- Stage max 0: the first due flip already fails.
SELECT pg_temp.paused('zero', 0, '-1 s', '1 h') AS zero \gset
SELECT results_eq(
    $$SELECT exhausted FROM pepsi.requeue_due(ARRAY['zero'], ARRAY[0], 10, interval '1 day')$$,
    $$VALUES (1)$$, 'MAX_RETRIES 0 means no retry');

-- Per stage: several rows of one stage are summed, stages come sorted.
SELECT pg_temp.paused('s2', 3, '-1 s', '1 h'), pg_temp.paused('s1', 3, '-1 s', '1 h'),
       pg_temp.paused('s2', 3, '-1 s', '1 h'), pg_temp.paused('s2', 3, '-1 s', '3 days'),
       pg_temp.paused('s3', 0, '-1 s', '1 h') \gset
SELECT results_eq(
    $$SELECT requeued, exhausted, expired, exhausted_stages, exhausted_counts, expired_stages, expired_counts
        FROM pepsi.requeue_due(ARRAY['s2', 's1', 's3'], ARRAY[3, 3, 3], NULL, interval '1 day')$$,
    $$VALUES (1, 3, 1, ARRAY['s1', 's2'], ARRAY[1, 2], ARRAY['s2'], ARRAY[1])$$,
    'exhausted and expired rows are counted per stage');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue
            WHERE stage IN ('s1', 's2') AND state->>'dispatch_error' = 'retries exhausted'), 3,
          'the rows counted as exhausted are the rows failed with retries exhausted');

-- Other states are never touched.
INSERT INTO pepsi.workqueue (stage, status, timeout, dispatcher_id) VALUES
    ('o', 'running', now() - interval '1 h', 5), ('o', 'pending', now() - interval '1 h', NULL);
SELECT results_eq(
    $$SELECT requeued, exhausted, expired FROM pepsi.requeue_due(NULL, NULL, 0, interval '1 s')$$,
    $$VALUES (0, 0, 0)$$, 'running and pending rows with a past timeout are not paused rows');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue WHERE stage = 'o' AND status IN ('running', 'pending')),
          2, 'they are left alone');

-- The 10,000-row batch limit: more due rows than that, next_due says call again.
INSERT INTO pepsi.workqueue (stage, status, timeout, created_at)
SELECT 'bulk', 'paused', now() - interval '1 min' + i * interval '1 ms', now()
  FROM generate_series(1, 10005) AS i;
SELECT results_eq(
    $$SELECT requeued, next_due <= now() FROM pepsi.requeue_due(NULL, NULL, NULL, NULL)$$,
    $$VALUES (10000, true)$$, 'one call moves at most 10,000 rows, earliest first, and says more are due');
SELECT results_eq(
    $$SELECT requeued, next_due FROM pepsi.requeue_due(NULL, NULL, NULL, NULL)$$,
    $$VALUES (5, NULL::timestamptz)$$, 'the next call takes the rest');
SELECT is((SELECT max(retries) FROM pepsi.workqueue WHERE stage = 'bulk'), 1,
          'no row was requeued twice');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue WHERE status = 'paused'), 0, 'nothing left paused');

SELECT * FROM finish();
ROLLBACK;
