-- pepsi.claim: one statement for all stages, each limited to its cap,
-- lowest ids first, pending rows only.
BEGIN;
SELECT plan(30);

-- 10 pending rows on each of a, b, c; interleaved ids.
SELECT count(*) FROM (
    SELECT pepsi.enqueue(s, jsonb_build_object('i', i))
      FROM generate_series(1, 10) AS i, unnest(ARRAY['a', 'b', 'c']) AS s
     ORDER BY i, s) x;
-- Rows of a in other states must never be claimed.
INSERT INTO pepsi.workqueue (stage, status, timeout, dispatcher_id) VALUES
    ('a', 'paused', now() - interval '1 h', NULL), ('a', 'done', NULL, NULL),
    ('a', 'failed', NULL, NULL), ('a', 'running', NULL, 99);

CREATE TEMP TABLE c1 AS
SELECT * FROM pepsi.claim(1, ARRAY['a', 'b', 'c'], ARRAY[3, 0, 2]);

SELECT is((SELECT count(*)::int FROM c1 WHERE stage = 'a'), 3, 'stage a gets exactly its cap of 3');
SELECT is((SELECT count(*)::int FROM c1 WHERE stage = 'b'), 0, 'a stage with cap 0 claims nothing');
SELECT is((SELECT count(*)::int FROM c1 WHERE stage = 'c'), 2, 'stage c gets exactly its cap of 2');
SELECT results_eq('SELECT workqueue_id FROM c1 WHERE stage = ''a''',
    $$SELECT workqueue_id FROM pepsi.workqueue WHERE stage = 'a' AND payload ? 'i'
       ORDER BY workqueue_id LIMIT 3$$,
    'claim takes the lowest ids of the stage, returned in id order');
SELECT results_eq('SELECT stage, workqueue_id FROM c1',
    'SELECT stage, workqueue_id FROM c1 ORDER BY stage, workqueue_id',
    'rows come back ordered by stage, then id');
SELECT ok((SELECT bool_and(w.status = 'running' AND w.dispatcher_id = 1)
             FROM c1 JOIN pepsi.workqueue w USING (workqueue_id)),
          'claimed rows are running and held by the claimer');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue WHERE status = 'running' AND dispatcher_id = 1),
          5, 'nothing else was claimed');

CREATE TEMP TABLE c2 AS
SELECT * FROM pepsi.claim(2, ARRAY['a', 'b', 'c'], ARRAY[100, 4, NULL]);
SELECT is((SELECT count(*)::int FROM c2 WHERE stage = 'a'), 7,
          'a cap above the backlog claims what is pending');
SELECT is_empty('SELECT 1 FROM c2 JOIN c1 USING (workqueue_id)',
                'a second claim never returns a row already claimed');
SELECT is((SELECT count(*)::int FROM c2 WHERE stage = 'c'), 0, 'a NULL cap claims nothing');
SELECT is((SELECT count(*)::int FROM c2 WHERE stage = 'b'), 4, 'stage b gets its cap of 4');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue WHERE stage = 'a' AND status = 'paused'),
          1, 'paused rows are not claimed');
SELECT is((SELECT dispatcher_id FROM pepsi.workqueue WHERE stage = 'a' AND status = 'running'
            AND NOT payload ? 'i'), 99::bigint, 'rows another dispatcher runs are not taken');

SELECT is_empty($$SELECT * FROM pepsi.claim(1, ARRAY['a'], ARRAY[5])$$,
                'a stage with nothing pending claims nothing');
SELECT is_empty($$SELECT * FROM pepsi.claim(1, ARRAY['nosuch'], ARRAY[5])$$,
                'an unknown stage claims nothing');
SELECT is_empty($$SELECT * FROM pepsi.claim(1, ARRAY[]::text[], ARRAY[]::int[])$$,
                'no stages, no rows');
SELECT is_empty($$SELECT * FROM pepsi.claim(1, ARRAY['b'], ARRAY[-3])$$,
                'a negative cap claims nothing');
SELECT throws_ok($$SELECT * FROM pepsi.claim(NULL, ARRAY['b'], ARRAY[1])$$, '22004', NULL,
                 'claim refuses a NULL dispatcher_id');
SELECT throws_ok($$SELECT * FROM pepsi.claim(1, ARRAY['b', 'c'], ARRAY[1])$$, '22023', NULL,
                 'claim refuses stages and caps of different lengths');

CREATE TEMP TABLE c3 AS
SELECT * FROM pepsi.claim(3, ARRAY['b', 'c'], ARRAY[2, 3], true);
SELECT is((SELECT count(*)::int FROM c3), 5, 'skip_locked claims by the same caps');
SELECT results_eq('SELECT workqueue_id FROM c3 WHERE stage = ''b''',
    $$SELECT workqueue_id FROM pepsi.workqueue WHERE stage = 'b' AND dispatcher_id = 3
       ORDER BY workqueue_id$$,
    'skip_locked also claims lowest ids first');
SELECT is((SELECT count(*)::int FROM pepsi.claim(4, ARRAY['b', 'b'], ARRAY[1, 1])), 1,
          'a stage named twice: the picks overlap and no row comes back twice');

-- after_ids (v4): a per-stage lower bound, NULL entries and a NULL array = none.
CREATE TEMP TABLE xy AS
SELECT s AS stage, pepsi.enqueue(s, jsonb_build_object('j', i)) AS workqueue_id
  FROM generate_series(1, 6) AS i, unnest(ARRAY['x', 'y']) AS s
 ORDER BY i, s;
CREATE TEMP TABLE xs AS
SELECT workqueue_id, row_number() OVER (ORDER BY workqueue_id) AS n FROM xy WHERE stage = 'x';
CREATE TEMP TABLE c5 AS
SELECT * FROM pepsi.claim(5, ARRAY['x', 'y'], ARRAY[2, 2], false,
                          ARRAY[(SELECT workqueue_id FROM xs WHERE n = 3), NULL]);
SELECT results_eq('SELECT workqueue_id FROM c5 WHERE stage = ''x''',
    'SELECT workqueue_id FROM xs WHERE n IN (4, 5) ORDER BY workqueue_id',
    'after_ids bounds the stage: the lowest ids above the bound');
SELECT results_eq('SELECT workqueue_id FROM c5 WHERE stage = ''y''',
    $$SELECT workqueue_id FROM xy WHERE stage = 'y' ORDER BY workqueue_id LIMIT 2$$,
    'a NULL entry of after_ids means no bound');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue w JOIN xs USING (workqueue_id)
            WHERE xs.n <= 3 AND w.status = 'pending'), 3,
          'rows at or below the bound stay pending');
CREATE TEMP TABLE c6 AS
SELECT * FROM pepsi.claim(6, ARRAY['x'], ARRAY[10], true,
                          ARRAY[(SELECT workqueue_id FROM xs WHERE n = 5)]);
SELECT results_eq('SELECT workqueue_id FROM c6',
    'SELECT workqueue_id FROM xs WHERE n = 6',
    'skip_locked honours after_ids too');
SELECT is((SELECT count(*)::int FROM pepsi.claim(7, ARRAY['x'], ARRAY[10], false, NULL)), 3,
          'a NULL after_ids claims from the low end');
SELECT throws_ok($$SELECT * FROM pepsi.claim(7, ARRAY['y'], ARRAY[10], false,
                                            ARRAY[NULL, 1]::bigint[])$$, '22023', NULL, 'claim refuses after_ids of a different length than stages');
SELECT is((SELECT count(*)::int FROM pepsi.claim(8, ARRAY['y'], ARRAY[3], true)), 3,
          'the 4-argument call still works (no bound)');
SELECT is((SELECT count(*)::int FROM pepsi.claim(8, ARRAY['y'], ARRAY[3])), 1,
          'the 3-argument call still works (no bound)');

SELECT * FROM finish();
ROLLBACK;
