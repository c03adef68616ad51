-- Message history (migration 0018): pepsi.attempts written by the trigger
-- workqueue_attempts on non-success endings only, note_traceback,
-- message_history with the derived rows, the bound of 20.
BEGIN;
SELECT plan(18);

-- 'r' retries automatically (MAX_RETRIES 3); 's' does not.
SELECT pepsi.register_stages(1, ARRAY['r', 's', 't'], ARRAY['', 't', ''], ARRAY[3, 3, 3],
                             ARRAY[interval '10 s', NULL, NULL], NULL, NULL, NULL);
CREATE FUNCTION pg_temp.claim_one(st text) RETURNS bigint LANGUAGE sql AS $$
    SELECT workqueue_id FROM pepsi.claim(1, ARRAY[st], ARRAY[1]) $$;
CREATE FUNCTION pg_temp.due_now(i bigint) RETURNS void LANGUAGE sql AS $$
    UPDATE pepsi.workqueue SET timeout = now() - interval '1 s' WHERE workqueue_id = i;
    SELECT count(*) FROM pepsi.requeue_due(ARRAY['r', 's', 't'], ARRAY[3, 3, 3], 100, NULL) $$;

-- The success path writes no history.
SELECT pepsi.enqueue('s', '{"n": 1}') AS ok1 \gset
SELECT pg_temp.claim_one('s');
SELECT pepsi.advance(:ok1, 's', 't', 1);
SELECT pg_temp.claim_one('t');
SELECT pepsi.finish(:ok1, 't', 1);
SELECT is((SELECT count(*)::int FROM pepsi.attempts), 0,
          'claim, advance, claim, finish: no history row written');
SELECT results_eq(format('SELECT attempt, stage, outcome FROM pepsi.message_history(%s)', :ok1),
    $$VALUES (NULL::int, 't'::text, 'done'::text)$$,
    'a message that just finished: its one attempt is derived from the row');

-- A retry and a crash, then success: paused by the stage, requeued, crash,
-- requeued, released, answered non-zero with a traceback, requeued, advanced, done.
SELECT pepsi.enqueue('s', '{"n": 2}') AS m \gset
SELECT pg_temp.claim_one('s');
SELECT pepsi.pause(:m, 's', now() + interval '1 h', 'rate limited', 1);
SELECT pg_temp.due_now(:m);
SELECT is((SELECT retries FROM pepsi.workqueue WHERE workqueue_id = :m), 1, 'the pause counted a retry');
SELECT pg_temp.claim_one('s');
SELECT count(*) FROM pepsi.record_dispatch_error(1, ARRAY[:m]::bigint[], ARRAY['failed'],
                                                 ARRAY['worker killed by signal SIGSEGV']);
SELECT pepsi.requeue_failed('s', ARRAY[:m]::bigint[]);
SELECT pg_temp.claim_one('s');
SELECT pepsi.release(1, ARRAY[:m]::bigint[]);
SELECT pg_temp.claim_one('s');
SELECT ok(pepsi.note_traceback(:m, 's', E'Traceback (most recent call last):\n  boom\nRuntimeError: upstream exploded', 1),
          'note_traceback on a running row held by the dispatcher');
SELECT ok(NOT pepsi.note_traceback(:m, 's', 'x', 2), 'note_traceback refuses another dispatcher''s row');
SELECT count(*) FROM pepsi.record_dispatch_error(1, ARRAY[:m]::bigint[], ARRAY['failed'],
                                                 ARRAY['1 RuntimeError: upstream exploded']);
SELECT pepsi.requeue_failed('s', ARRAY[:m]::bigint[]);
SELECT pg_temp.claim_one('s');
SELECT pepsi.advance(:m, 's', 't', 1);
SELECT pg_temp.claim_one('t');
SELECT pepsi.finish(:m, 't', 1);
SELECT results_eq(format($$SELECT attempt, stage, outcome, reason, traceback IS NOT NULL,
                                  started_at IS NOT NULL, ended_at IS NOT NULL
                             FROM pepsi.message_history(%s)$$, :m),
    $$VALUES (1, 's'::text, 'paused'::text, 'rate limited'::text, false, true, true),
             (2, 's', 'crash', 'worker killed by signal SIGSEGV', false, true, true),
             (3, 's', 'released', NULL, false, true, true),
             (4, 's', 'failed', '1 RuntimeError: upstream exploded', true, true, true),
             (NULL, 's', 'left', 'now at stage t', false, false, false),
             (NULL, 't', 'done', NULL, false, false, true)$$,
    'history across a pause, a crash, a release and a failure, then success');
SELECT is((SELECT traceback FROM pepsi.message_history(:m) WHERE attempt = 4),
          E'Traceback (most recent call last):\n  boom\nRuntimeError: upstream exploded',
          'the SDK''s traceback lands in the failure''s attempt');
SELECT is((SELECT count(*)::int FROM pepsi.tracebacks), 0, 'and leaves pepsi.tracebacks');

-- Automatic retries: a timeout and a crash retried by record_dispatch_error.
SELECT pepsi.enqueue('r') AS a \gset
SELECT pg_temp.claim_one('r');
SELECT count(*) FROM pepsi.record_dispatch_error(1, ARRAY[:a]::bigint[], ARRAY['failed'],
                                                 ARRAY['worker exited with code 3']);
SELECT pg_temp.due_now(:a);
SELECT pg_temp.claim_one('r');
SELECT count(*) FROM pepsi.record_dispatch_error(1, ARRAY[:a]::bigint[], ARRAY['timeout'],
                                                 ARRAY['timeout: no answer within MAX_RUNTIME']);
SELECT pg_temp.due_now(:a);
SELECT pg_temp.claim_one('r');
SELECT results_eq(format('SELECT attempt, outcome, reason FROM pepsi.message_history(%s)', :a),
    $$VALUES (1, 'crash'::text, 'worker exited with code 3'::text),
             (2, 'timeout', 'timeout: no answer within MAX_RUNTIME'),
             (NULL, 'running', NULL)$$,
    'automatic retries: the crash and the timeout each recorded, then the running attempt');
SELECT is((SELECT retries FROM pepsi.message_story(:a)), 2, 'retries counts the two retries');
SELECT is((SELECT max_retries FROM pepsi.message_story(:a)), 3, 'against the stage''s MAX_RETRIES');
SELECT is((SELECT errors FROM pepsi.message_story(:a)), '{}'::jsonb,
          'message_story: no stale pause_reason/retry_error once it runs again');

-- A stage's own fail, a timeout without retry, cancel, expiry.
SELECT pepsi.enqueue('s') AS f \gset
SELECT pg_temp.claim_one('s');
SELECT pepsi.fail(:f, 's', 'bad input n=7', 1);
SELECT pepsi.enqueue('s') AS t1 \gset
SELECT pg_temp.claim_one('s');
SELECT count(*) FROM pepsi.record_dispatch_error(1, ARRAY[:t1]::bigint[], ARRAY['timeout'], ARRAY['timeout: 5 s']);
SELECT pepsi.enqueue('s') AS c \gset
SELECT pepsi.cancel(ARRAY[:c]::bigint[]);
SELECT results_eq(format('SELECT workqueue_id, outcome, reason FROM pepsi.attempts WHERE workqueue_id IN (%s, %s, %s) ORDER BY workqueue_id', :f, :t1, :c),
    format($$VALUES (%s::bigint, 'failed'::text, 'bad input n=7'::text),
                    (%s, 'timeout', 'timeout: 5 s'), (%s, 'cancelled', 'cancelled by operator')$$, :f, :t1, :c),
    'a stage''s fail, a timeout, a cancel');
INSERT INTO pepsi.workqueue (stage, status, timeout, created_at)
VALUES ('s', 'paused', now() - interval '1 s', now() - interval '3 d')
RETURNING workqueue_id AS e \gset
SELECT count(*) FROM pepsi.requeue_due(ARRAY['s'], ARRAY[3], 100, interval '1 d');
SELECT results_eq(format('SELECT outcome, started_at IS NULL FROM pepsi.message_history(%s)', :e),
    $$VALUES ('expired'::text, true)$$, 'expiry is recorded (no start: it never ran)');

-- The bound: only the last 20 attempts stay.
SELECT pepsi.enqueue('s') AS b \gset
DO $$
DECLARE
    i int;
    id bigint := (SELECT max(workqueue_id) FROM pepsi.workqueue);
BEGIN
    FOR i IN 1..25 LOOP
        PERFORM pepsi.claim(1, ARRAY['s'], ARRAY[1]);
        PERFORM pepsi.release(1, ARRAY[id]);
    END LOOP;
END
$$;
SELECT results_eq(format('SELECT count(*)::int, min(attempt), max(attempt) FROM pepsi.attempts WHERE workqueue_id = %s', :b),
    $$VALUES (20, 6, 25)$$, '25 releases keep the last 20 attempts');
SELECT pepsi.cancel(ARRAY[:b]::bigint[]);

-- note_traceback truncates; history goes with its message when it is purged.
SELECT pepsi.enqueue('s') AS l \gset
SELECT pg_temp.claim_one('s');
SELECT pepsi.note_traceback(:l, 's', repeat('a', 3000) || repeat('z', 3000), 1);
SELECT ok((SELECT length(traceback) <= 4010 AND traceback LIKE 'aaa%' AND traceback LIKE '%zzz'
             FROM pepsi.tracebacks WHERE workqueue_id = :l),
          'a long traceback keeps its head and its tail, about 4000 characters');
UPDATE pepsi.workqueue SET status = 'failed', dispatcher_id = NULL WHERE workqueue_id = :l;
SELECT pepsi.keep_dead_letters(10);  -- one of them kept in dead_letters: purged all the same
SELECT pepsi.purge(ARRAY['failed'], 's');
SELECT is((SELECT count(*)::int FROM pepsi.attempts WHERE workqueue_id IN (:b, :l))
          + (SELECT count(*)::int FROM pepsi.tracebacks WHERE workqueue_id = :l), 0,
          'purging a message deletes its history and its noted traceback');
SELECT is_empty('SELECT * FROM pepsi.message_history(-1)', 'message_history of an unknown id is empty');

SELECT * FROM finish();
ROLLBACK;
