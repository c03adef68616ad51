-- Priorities: pepsi.enqueue/enqueue_many(priority => N), pepsi.claim v5
-- (highest priority first within a stage, equal priorities in id order,
-- every stage in one statement, on workqueue_pending_idx), and an advance
-- keeps the priority.
BEGIN;
SELECT plan(16);

SELECT pepsi.enqueue('p', '{"n": 1}') AS a0,
       pepsi.enqueue('p', '{"n": 2}', priority => 5) AS b5,
       pepsi.enqueue('p', '{"n": 3}', priority => -3) AS c_3,
       pepsi.enqueue('p', '{"n": 4}', priority => 5) AS d5,
       pepsi.enqueue('p', '{"n": 5}', NULL, 0) AS e0,
       pepsi.enqueue('p', '{"n": 6}', priority => NULL) AS f0,
       pepsi.enqueue('q', '{"n": 7}', priority => 1) AS q1 \gset

SELECT is((SELECT priority FROM pepsi.workqueue WHERE workqueue_id = :a0), 0,
          'the default priority is 0');
SELECT is((SELECT priority FROM pepsi.workqueue WHERE workqueue_id = :c_3), -3,
          'a negative priority is kept');
SELECT is((SELECT priority FROM pepsi.workqueue WHERE workqueue_id = :f0), 0,
          'a NULL priority means 0');

-- Claimed one at a time (a PARALLELISM 1, QUEUE_LIMIT 1 stage's claims).
CREATE TEMP TABLE order_seen (k serial, workqueue_id bigint);
DO $$
BEGIN
    FOR i IN 1..6 LOOP
        INSERT INTO order_seen (workqueue_id)
        SELECT workqueue_id FROM pepsi.claim(1, ARRAY['p'], ARRAY[1]);
    END LOOP;
END
$$;
SELECT results_eq('SELECT workqueue_id FROM order_seen ORDER BY k',
    format('VALUES (%s::bigint), (%s), (%s), (%s), (%s), (%s)', :b5, :d5, :a0, :e0, :f0, :c_3),
    'claims of one row take the highest priority first, equal priorities in id order');

-- One claim of several rows over two stages: order within each stage, the
-- priority column comes back.
UPDATE pepsi.workqueue SET status = 'pending', dispatcher_id = NULL WHERE stage = 'p';
SELECT results_eq('SELECT workqueue_id, stage, priority FROM pepsi.claim(2, ARRAY[''p'', ''q''], ARRAY[4, 4])',
    format($$VALUES (%s::bigint, 'p'::text, 5), (%s, 'p', 5), (%s, 'p', 0), (%s, 'p', 0), (%s, 'q', 1)$$,
           :b5, :d5, :a0, :e0, :q1),
    'one statement claims every stage, each by priority then id, and returns the priority');
SELECT results_eq('SELECT workqueue_id FROM pepsi.claim(3, ARRAY[''p''], ARRAY[4], true)',
    format('VALUES (%s::bigint), (%s)', :f0, :c_3),
    'skip_locked claims by priority too, the negative band last');

-- after_ids bounds only the priority-0 band.
UPDATE pepsi.workqueue SET status = 'pending', dispatcher_id = NULL WHERE stage = 'p';
SELECT results_eq(format('SELECT workqueue_id FROM pepsi.claim(4, ARRAY[''p''], ARRAY[10], false, ARRAY[%s]::bigint[])', :e0),
    format('VALUES (%s::bigint), (%s), (%s), (%s)', :b5, :d5, :f0, :c_3),
    'a floor skips priority-0 rows at or below it, never other priorities');

-- An advance (and a hop) keeps the priority.
SELECT ok(pepsi.advance(:b5, 'p', 'r', 4), 'advance p -> r');
SELECT results_eq(format('SELECT stage, status, priority FROM pepsi.workqueue WHERE workqueue_id = %s', :b5),
    $$VALUES ('r'::text, 'pending'::text, 5)$$, 'the advanced message keeps priority 5');
SELECT pepsi.enqueue('r', '{}') AS r0 \gset
SELECT is((SELECT workqueue_id FROM pepsi.claim(5, ARRAY['r'], ARRAY[1])), :b5::bigint,
          'at the next stage it goes before a newer priority-0 message');

-- enqueue_many: one priority for the batch.
CREATE TEMP TABLE many AS
SELECT id FROM pepsi.enqueue_many('m', ARRAY['{}', '{}']::jsonb[], priority => 7) AS id;
SELECT is((SELECT count(*)::int FROM pepsi.workqueue w JOIN many ON w.workqueue_id = many.id
            WHERE w.priority = 7), 2, 'enqueue_many sets the priority of every row');
SELECT is((SELECT count(*)::int FROM pepsi.enqueue_many('m', ARRAY['{}']::jsonb[], now() + interval '1 h', -1)),
          1, 'enqueue_many takes priority as its fourth positional argument');

-- The pick is on workqueue_pending_idx: each band is a range of the index,
-- the floor part of the priority-0 range (claim v8 writes that band as the
-- range priority >= 0 AND priority <= 0, see claim.v8.sql).
INSERT INTO pepsi.workqueue (stage, status, priority)
SELECT 's' || (i % 8), CASE WHEN i % 10 < 8 THEN 'done' ELSE 'pending' END, (i % 3) - 1
  FROM generate_series(1, 20000) AS i;
ANALYZE pepsi.workqueue;
CREATE FUNCTION pg_temp.plan_of(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE p json;
BEGIN
    EXECUTE 'EXPLAIN (FORMAT JSON) ' || q INTO p;
    RETURN p::text;
END $$;
SELECT matches(pg_temp.plan_of($$SELECT q.workqueue_id FROM pepsi.workqueue AS q
    WHERE q.stage = 's1' AND q.status = 'pending' AND q.priority >= 0 AND q.priority <= 0
      AND q.workqueue_id > 100
    ORDER BY q.stage, q.priority DESC, q.workqueue_id LIMIT 16$$),
    '"Index Name": "workqueue_pending_idx".*"Index Cond": "\(\(stage = ''s1''::text\) AND \(priority >= 0\) AND \(priority <= 0\) AND \(workqueue_id > 100\)\)"',
    'the priority-0 band is one index range starting at (stage, 0, floor)');
SELECT matches(pg_temp.plan_of($$SELECT q.workqueue_id FROM pepsi.workqueue AS q
    WHERE q.stage = 's1' AND q.status = 'pending' AND q.priority > 0
    ORDER BY q.stage, q.priority DESC, q.workqueue_id LIMIT 16$$),
    '"Index Name": "workqueue_pending_idx".*"Index Cond": "\(\(stage = ''s1''::text\) AND \(priority > 0\)\)"',
    'the positive band is an index range');
SELECT doesnt_match(pg_temp.plan_of($$SELECT q.workqueue_id FROM pepsi.workqueue AS q
    WHERE q.stage = 's1' AND q.status = 'pending' AND q.priority < 0
    ORDER BY q.stage, q.priority DESC, q.workqueue_id LIMIT 16$$),
    '"Node Type": "(Sort|Seq Scan)"', 'the negative band needs no sort and no table scan');
SELECT is((SELECT count(*)::int FROM pepsi.claim(9, ARRAY['s0', 's1', 's2'], ARRAY[16, 16, 16])), 48,
          'a claim over a bigger table still takes every cap');

SELECT * FROM finish();
ROLLBACK;
