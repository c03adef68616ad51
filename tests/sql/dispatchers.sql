-- The dispatcher registry and what happens to rows whose holder is gone:
-- register_dispatcher, heartbeat, unregister_dispatcher, reset_orphans, release.
BEGIN;
SELECT plan(29);

CREATE FUNCTION pg_temp.running(s text, d bigint) RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO pepsi.workqueue (stage, status, dispatcher_id, retries)
    VALUES (s, 'running', d, 3) RETURNING workqueue_id $$;

SELECT pepsi.register_dispatcher('host-a', 100, true) AS me,
       pepsi.register_dispatcher('host-b', 200, true) AS alive,
       pepsi.register_dispatcher('host-c', 300, true) AS dead \gset
SELECT ok(:me < :alive AND :alive < :dead, 'register_dispatcher returns increasing ids');
SELECT results_eq(format('SELECT hostname, pid, competing FROM pepsi.dispatchers WHERE dispatcher_id = %s', :me),
    $$VALUES ('host-a'::text, 100, true)$$, 'the registry row records host, pid and mode');

UPDATE pepsi.dispatchers SET heartbeat_at = now() - interval '1 h' WHERE dispatcher_id = :dead;
SELECT lives_ok(format('SELECT pepsi.heartbeat(%s)', :alive), 'heartbeat of a registered dispatcher');
SELECT throws_ok('SELECT pepsi.heartbeat(NULL)', '22004', NULL, 'heartbeat of NULL is refused');

SELECT pg_temp.running('s', :me) AS mine, pg_temp.running('s', :alive) AS alives,
       pg_temp.running('s', :dead) AS deads, pg_temp.running('s', 424242) AS ghosts \gset

-- Competing mode.
SELECT is(pepsi.reset_orphans(:me, true, interval '5 min'), 2,
          'competing: rows of a stale and of an unregistered dispatcher are reset');
SELECT results_eq(format($$SELECT workqueue_id, status, dispatcher_id, retries FROM pepsi.workqueue
                            WHERE workqueue_id IN (%s, %s) ORDER BY 1$$, :deads, :ghosts),
    format($$VALUES (%s::bigint, 'pending'::text, NULL::bigint, 3), (%s, 'pending', NULL, 3)$$,
           :deads, :ghosts),
    'reset rows are pending, without dispatcher, retries unchanged');
SELECT is((SELECT dispatcher_id FROM pepsi.workqueue WHERE workqueue_id = :alives), :alive::bigint,
          'competing: a live replica keeps its rows');
SELECT is((SELECT dispatcher_id FROM pepsi.workqueue WHERE workqueue_id = :mine), :me::bigint,
          'competing: the caller keeps its rows');
SELECT is_empty(format('SELECT 1 FROM pepsi.dispatchers WHERE dispatcher_id = %s', :dead),
                'the stale dispatcher is removed from the registry');
SELECT lives_ok(format('SELECT pepsi.heartbeat(%s)', :dead),
                'a removed dispatcher''s next heartbeat does not fail (it would reconnect forever)');
SELECT is((SELECT count(*)::int FROM pepsi.dispatchers WHERE dispatcher_id = :dead), 1,
          'it re-registers under the same id');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :deads), 'pending',
          'its reset rows stay reset (its late writes are fenced)');
SELECT ok(pepsi.register_dispatcher('host-d', 400, true) > :dead,
          'ids handed out later do not collide with the re-registered one');

-- Non-competing mode: the caller holds the lock, every other holder is gone.
SELECT is(pepsi.reset_orphans(:me, false, interval '5 min'), 1,
          'non-competing: every running row not held by the caller is reset');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :alives), 'pending',
          'non-competing: including rows of a registered dispatcher');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :mine), 'running',
          'non-competing: the caller keeps its rows');
SELECT is(pepsi.reset_orphans(:me, false, interval '5 min'), 0, 'reset_orphans twice: nothing left');

-- release
SELECT pg_temp.running('r', :me) AS r1, pg_temp.running('r', :me) AS r2,
       pg_temp.running('r', :me) AS r3, pg_temp.running('r', :alive) AS r4 \gset
SELECT is(pepsi.release(:me, ARRAY[:r1, :r4]::bigint[]), 1,
          'release only moves listed rows held by the caller');
SELECT results_eq(format('SELECT status, dispatcher_id, retries FROM pepsi.workqueue WHERE workqueue_id = %s', :r1),
    $$VALUES ('pending'::text, NULL::bigint, 3)$$, 'a released row is pending again, retries unchanged');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :r4), 'running',
          'release never touches another dispatcher''s row');
SELECT is(pepsi.release(:me, ARRAY[]::bigint[]), 0, 'release of an empty list releases nothing');
UPDATE pepsi.workqueue SET status = 'done', dispatcher_id = NULL WHERE workqueue_id = :r2;
SELECT is(pepsi.release(:me), 2, 'release with ids NULL releases every row the caller holds');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :r2), 'done',
          'a row the stage already finished is not released');
SELECT is(pepsi.release(NULL), 0, 'release for a NULL dispatcher releases nothing');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue WHERE status = 'running' AND dispatcher_id = :alive),
          1, 'the other dispatcher still holds its row');

-- unregister
SELECT pg_temp.running('u', :alive) AS u1 \gset
SELECT lives_ok(format('SELECT pepsi.unregister_dispatcher(%s)', :alive), 'unregister_dispatcher');
SELECT is_empty(format('SELECT 1 FROM pepsi.dispatchers WHERE dispatcher_id = %s', :alive),
                'the registry row is gone');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue WHERE dispatcher_id = :alive), 0,
          'rows it still held went back to pending');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :u1), 'pending',
          'no row is left running without a live holder');

SELECT * FROM finish();
ROLLBACK;
