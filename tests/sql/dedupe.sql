-- Dedupe keys: pepsi.enqueue(dedupe_key => k) / enqueue_many(dedupe_keys =>
-- ...) insert nothing while a pending, running or paused message carries the
-- key and return its id; a terminal message frees the key; two sessions
-- racing for one key get one row and the same id (real second connections,
-- through dblink); requeue_failed never requeues a key twice.
\set pghost ''
\set pgport ''
\set pguser ''
\set pgpassword ''
\getenv pghost PGHOST
\getenv pgport PGPORT
\getenv pguser PGUSER
\getenv pgpassword PGPASSWORD
BEGIN;
SELECT plan(31);
CREATE EXTENSION IF NOT EXISTS dblink;

SELECT pepsi.enqueue('a', '{"n": 1}', dedupe_key => 'k1') AS k1,
       pepsi.enqueue('a', '{"n": 2}', dedupe_key => 'k2', priority => 3) AS k2 \gset
SELECT is(pepsi.enqueue('b', '{"n": 9}', dedupe_key => 'k1'), :k1::bigint,
          'a key a pending message carries returns that message''s id (even at another stage)');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue WHERE dedupe_key = 'k1'), 1,
          'and inserts nothing');
SELECT is((SELECT payload FROM pepsi.workqueue WHERE workqueue_id = :k1), '{"n": 1}'::jsonb,
          'the first message is left as it was');
SELECT results_eq(format('SELECT priority, dedupe_key FROM pepsi.message_story(%s)', :k2),
    $$VALUES (3, 'k2'::text)$$, 'message_story (pepsi-queue show) returns the priority and the key');
SELECT isnt(pepsi.enqueue('a', '{}'), :k1::bigint, 'no key: a new message every time');
SELECT isnt(pepsi.enqueue('a', '{}'), pepsi.enqueue('a', '{}'), 'keyless messages never collide');

-- Running and paused (and delayed) messages hold their key too.
UPDATE pepsi.workqueue SET status = 'running', dispatcher_id = 1 WHERE workqueue_id = :k1;
SELECT is(pepsi.enqueue('a', '{}', dedupe_key => 'k1'), :k1::bigint, 'a running message holds its key');
SELECT pepsi.pause(:k1, 'a', now() + interval '1 h');
SELECT is(pepsi.enqueue('a', '{}', dedupe_key => 'k1'), :k1::bigint, 'a paused message holds its key');
SELECT pepsi.enqueue('a', '{}', now() + interval '1 h', dedupe_key => 'kd') AS kd \gset
SELECT is(pepsi.enqueue('a', '{}', dedupe_key => 'kd'), :kd::bigint, 'a delayed message holds its key');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :kd), 'paused',
          'a duplicate enqueue without not_before leaves the delayed message delayed');

-- Every terminal status frees the key.
CREATE TEMP TABLE freed (status text, first_id bigint, second_id bigint);
DO $$
DECLARE
    s text;
    first bigint;
BEGIN
    FOREACH s IN ARRAY ARRAY['done', 'failed', 'timeout', 'expired'] LOOP
        first := pepsi.enqueue('t', '{}', dedupe_key => 'kt-' || s);
        UPDATE pepsi.workqueue SET status = s WHERE workqueue_id = first;
        INSERT INTO freed VALUES (s, first, pepsi.enqueue('t', '{}', dedupe_key => 'kt-' || s));
    END LOOP;
END
$$;
SELECT is((SELECT count(*)::int FROM freed WHERE second_id > first_id), 4,
          'done, failed, timeout and expired free the key: a new message is inserted');
SELECT pepsi.enqueue('t', '{}', dedupe_key => 'kc') AS kc \gset
SELECT is(pepsi.cancel(ARRAY[:kc]::bigint[]), 1, 'cancel a keyed message');
SELECT isnt(pepsi.enqueue('t', '{}', dedupe_key => 'kc'), :kc::bigint, 'a cancelled message frees its key');

SELECT throws_ok($$SELECT pepsi.enqueue('a', '{}', dedupe_key => '')$$, '22023', NULL,
                 'an empty key is refused');
SELECT throws_ok(format('SELECT pepsi.enqueue(''a'', ''{}'', dedupe_key => %L)', repeat('x', 513)),
                 '22023', NULL, 'a key over 512 bytes is refused');

-- enqueue_many: keys aligned with payloads.
SELECT array_agg(id ORDER BY n) AS ids
  FROM pepsi.enqueue_many('m', ARRAY['{"i": 1}', '{"i": 2}', '{"i": 3}', '{"i": 4}', '{"i": 5}']::jsonb[],
                          dedupe_keys => ARRAY['m1', NULL, 'k2', 'm1', NULL]) WITH ORDINALITY AS u(id, n) \gset
SELECT is((:'ids'::bigint[])[3], :k2::bigint, 'enqueue_many: a key a live message holds returns its id');
SELECT is((:'ids'::bigint[])[4], (:'ids'::bigint[])[1], 'enqueue_many: a key repeated in one call returns the first element''s id');
SELECT ok((:'ids'::bigint[])[1] < (:'ids'::bigint[])[2] AND (:'ids'::bigint[])[2] < (:'ids'::bigint[])[5],
          'enqueue_many: the inserted rows'' ids ascend in array order');
SELECT results_eq(format('SELECT payload FROM pepsi.workqueue WHERE workqueue_id IN (%s, %s, %s) ORDER BY workqueue_id',
                         (:'ids'::bigint[])[1], (:'ids'::bigint[])[2], (:'ids'::bigint[])[5]),
    $$VALUES ('{"i": 1}'::jsonb), ('{"i": 2}'), ('{"i": 5}')$$,
    'enqueue_many: each id names its own element''s payload');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue WHERE stage = 'm'), 3,
          'enqueue_many inserted exactly the 3 new messages');
SELECT throws_ok($$SELECT pepsi.enqueue_many('m', ARRAY['{}', '{}']::jsonb[], dedupe_keys => ARRAY['x'])$$,
                 '22023', NULL, 'enqueue_many refuses keys not aligned with payloads');
SELECT is((SELECT count(*)::int FROM pepsi.enqueue_many('m', ARRAY['{}']::jsonb[], NULL, 0, ARRAY[NULL]::text[])),
          1, 'enqueue_many with only NULL keys inserts as without keys');

-- requeue_failed leaves a row whose key is taken, and requeues one of two.
SELECT pepsi.enqueue('r', '{}', dedupe_key => 'kr') AS r1 \gset
UPDATE pepsi.workqueue SET status = 'failed' WHERE workqueue_id = :r1;
SELECT pepsi.enqueue('r', '{}', dedupe_key => 'kr') AS r2 \gset
SELECT is(pepsi.requeue_failed(ids => ARRAY[:r1]::bigint[]), 0,
          'requeue_failed skips a failed row whose key a live message holds');
UPDATE pepsi.workqueue SET status = 'failed' WHERE workqueue_id = :r2;
SELECT is(pepsi.requeue_failed('r'), 1, 'of two failed rows with one key, one is requeued');
SELECT is((SELECT workqueue_id FROM pepsi.workqueue WHERE dedupe_key = 'kr' AND status = 'pending'),
          :r1::bigint, 'the lowest id');

-- The race, with two real sessions (committed rows; cleaned up below).
SELECT concat_ws(' ', 'dbname=' || current_database(),
                 nullif('host=' || :'pghost', 'host='), nullif('port=' || :'pgport', 'port='),
                 nullif('user=' || :'pguser', 'user='), nullif('password=' || :'pgpassword', 'password='))
       AS connstr \gset
SELECT dblink_connect('one', :'connstr'), dblink_connect('two', :'connstr');
SELECT (SELECT p FROM dblink('two', 'SELECT pg_backend_pid()') AS x(p int)) AS two_pid \gset
CREATE FUNCTION pg_temp.wait_blocked(pid int) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..1000 LOOP  -- up to 10 s
        IF EXISTS (SELECT FROM pg_stat_activity WHERE pg_stat_activity.pid = wait_blocked.pid
                                                 AND wait_event_type = 'Lock') THEN
            RETURN true;
        END IF;
        PERFORM pg_sleep(0.01);
    END LOOP;
    RETURN false;
END $$;

SELECT dblink_exec('one', 'BEGIN');
SELECT (SELECT id FROM dblink('one', $$SELECT pepsi.enqueue('race', '{"by": 1}', dedupe_key => 'race-commit')$$)
          AS x(id bigint)) AS one_id \gset
SELECT dblink_send_query('two', $$SELECT pepsi.enqueue('race', '{"by": 2}', dedupe_key => 'race-commit')$$);
SELECT ok(pg_temp.wait_blocked(:two_pid), 'the second session waits for the first''s key');
SELECT dblink_exec('one', 'COMMIT');
SELECT is((SELECT id FROM dblink_get_result('two') AS x(id bigint)), :one_id::bigint,
          'when the first commits, the second gets the same id, without an error');
SELECT * FROM dblink_get_result('two') AS x(id bigint);
SELECT is((SELECT count(*)::int FROM dblink('one', $$SELECT 1 FROM pepsi.workqueue WHERE dedupe_key = 'race-commit'$$) AS x(one int)),
          1, 'exactly one row exists');

SELECT dblink_exec('one', 'BEGIN');
SELECT (SELECT id FROM dblink('one', $$SELECT pepsi.enqueue('race', '{"by": 1}', dedupe_key => 'race-rollback')$$)
          AS x(id bigint)) AS one_id \gset
SELECT dblink_send_query('two', $$SELECT pepsi.enqueue('race', '{"by": 2}', dedupe_key => 'race-rollback')$$);
SELECT ok(pg_temp.wait_blocked(:two_pid), 'again the second session waits');
SELECT dblink_exec('one', 'ROLLBACK');
SELECT (SELECT id FROM dblink_get_result('two') AS x(id bigint)) AS two_id \gset
SELECT * FROM dblink_get_result('two') AS x(id bigint);
SELECT isnt(:two_id::bigint, :one_id::bigint, 'when the first rolls back, the second inserts its own message');
SELECT results_eq($$SELECT payload FROM dblink('one', 'SELECT payload FROM pepsi.workqueue WHERE dedupe_key = ''race-rollback''') AS x(payload jsonb)$$,
    $$VALUES ('{"by": 2}'::jsonb)$$, 'and it is the only row with the key');

SELECT dblink_exec('one', $$DELETE FROM pepsi.workqueue WHERE stage = 'race'$$);
SELECT dblink_disconnect('one'), dblink_disconnect('two');

SELECT * FROM finish();
ROLLBACK;
