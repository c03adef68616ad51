-- pepsi.pause v3 refuses a non-finite `until`; requeue_due v3 survives rows
-- paused until 'infinity' before that (pause v1/v2 accepted them).
BEGIN;
SELECT plan(9);

CREATE FUNCTION pg_temp.running(s text) RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO pepsi.workqueue (stage, status, dispatcher_id)
    VALUES (s, 'running', 1) RETURNING workqueue_id $$;
SELECT pg_temp.running('p') AS r1 \gset

SELECT throws_ok(format($$SELECT pepsi.pause(%s, 'p', 'infinity')$$, :r1), '22008',
                 'pause needs a finite time to resume (until is infinity)',
                 'pause refuses until = infinity with 22008');
SELECT throws_ok(format($$SELECT pepsi.pause(%s, 'p', '-infinity', 'why', 1)$$, :r1), '22008',
                 NULL, 'pause refuses until = -infinity');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :r1), 'running',
          'a refused pause leaves the row running');
SELECT throws_ok(format($$SELECT pepsi.pause(%s, 'p', NULL)$$, :r1), '22004', NULL,
                 'a NULL until is still 22004');
SELECT is(pepsi.pause(:r1, 'p', now() + interval '1 h', 'later', 1), true,
          'a finite until still pauses');

-- A row paused until 'infinity' written before pause v3 (directly here).
INSERT INTO pepsi.workqueue (stage, status, timeout) VALUES ('p', 'paused', 'infinity')
RETURNING workqueue_id AS forever \gset
SELECT lives_ok($$SELECT * FROM pepsi.requeue_due(ARRAY['p'], ARRAY[3], 10, interval '1 day')$$,
                'requeue_due does not fail over a row paused until infinity');
SELECT is((SELECT next_due FROM pepsi.requeue_due(ARRAY['p'], ARRAY[3], 10, interval '1 day')),
          now() + interval '1 h', 'next_due skips the infinite timeout');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :forever), 'paused',
          'a row paused until infinity is never due');
UPDATE pepsi.workqueue SET status = 'done', timeout = NULL WHERE workqueue_id = :r1;
SELECT lives_ok($$SELECT requeued, next_due - statement_timestamp()
                    FROM pepsi.requeue_due(ARRAY['p'], ARRAY[3], 10, NULL)$$,
                'with only an infinite row paused, next_due is NULL and the dispatcher''s subtraction works');

SELECT * FROM finish();
ROLLBACK;
