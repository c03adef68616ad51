-- pepsi.reschedule / dashboard_reschedule: move a paused or delayed
-- message's due time without counting a retry; refuse running and terminal
-- messages.
BEGIN;
SELECT plan(24);

-- A delayed message: earlier and later, the mark follows, no retry counted.
SELECT pepsi.enqueue('d', '{}', now() + interval '1 h') AS delayed \gset
SELECT is(pepsi.reschedule(:delayed, now() + interval '2 h'), now() + interval '2 h',
          'a delayed message moved later: the new due time comes back');
SELECT results_eq(format('SELECT status, timeout, (state->>''delayed_until'')::timestamptz, retries FROM pepsi.workqueue WHERE workqueue_id = %s', :delayed),
    $$VALUES ('paused'::text, now() + interval '2 h', now() + interval '2 h', 0)$$,
    'it stays delayed; its mark follows the due time');
SELECT is(pepsi.reschedule(:delayed), now(), 'no time given: due now');
SELECT results_eq($$SELECT requeued, exhausted, expired FROM pepsi.requeue_due(ARRAY['d'], ARRAY[0], 0, interval '1 s')$$,
    $$VALUES (1, 0, 0)$$, 'requeue_due makes it pending even with MAX_RETRIES 0');
SELECT results_eq(format('SELECT status, retries FROM pepsi.workqueue WHERE workqueue_id = %s', :delayed),
    $$VALUES ('pending'::text, 0)$$, 'pending, no retry counted');

-- A message its stage paused: the due time moves, retries untouched.
SELECT pepsi.enqueue('p', '{}') AS paused \gset
UPDATE pepsi.workqueue SET status = 'running', dispatcher_id = 1, retries = 2 WHERE workqueue_id = :paused;
SELECT pepsi.pause(:paused, 'p', now() + interval '1 day', 'waiting for a partner');
SELECT is(pepsi.reschedule(:paused, now() - interval '1 h'), now(), 'a past time means now');
SELECT results_eq(format('SELECT status, timeout, retries, state ? ''delayed_until'' FROM pepsi.workqueue WHERE workqueue_id = %s', :paused),
    $$VALUES ('paused'::text, now(), 2, false)$$,
    'a stage''s pause stays a pause, due now, retries unchanged');
SELECT is((SELECT next_due FROM pepsi.requeue_due(ARRAY['p'], ARRAY[10], 10, NULL)), NULL::timestamptz,
          'requeue_due takes it at once');
SELECT results_eq(format('SELECT status, retries FROM pepsi.workqueue WHERE workqueue_id = %s', :paused),
    $$VALUES ('pending'::text, 3)$$, 'its pause''s own retry is counted as for any pause, no more');

-- A pending message moved later becomes delayed; moved to now, it is left alone.
SELECT pepsi.enqueue('n', '{}') AS pend \gset
SELECT is(pepsi.reschedule(:pend, now()), now(), 'a pending message moved to now: already due');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :pend), 'pending', 'and left pending');
SELECT is(pepsi.reschedule(:pend, now() + interval '5 min'), now() + interval '5 min',
          'a pending message moved later');
SELECT results_eq(format('SELECT status, timeout, (state->>''delayed_until'')::timestamptz FROM pepsi.workqueue WHERE workqueue_id = %s', :pend),
    $$VALUES ('paused'::text, now() + interval '5 min', now() + interval '5 min')$$,
    'waits as a delayed message');

-- Refusals.
SELECT pepsi.enqueue('r', '{}') AS running \gset
UPDATE pepsi.workqueue SET status = 'running', dispatcher_id = 1 WHERE workqueue_id = :running;
SELECT throws_like(format('SELECT pepsi.reschedule(%s)', :running),
    '%is running at stage r%', 'a running message is refused, saying so');
SELECT throws_ok(format('SELECT pepsi.reschedule(%s)', :running), '55000', NULL,
    'with SQLSTATE 55000');
UPDATE pepsi.workqueue SET status = 'failed', dispatcher_id = NULL WHERE workqueue_id = :running;
SELECT throws_like(format('SELECT pepsi.reschedule(%s)', :running),
    '%is failed (terminal); requeue it instead%', 'a failed message is refused, pointing to requeue');
CREATE FUNCTION pg_temp.hint_of(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE h text;
BEGIN
    EXECUTE q;
    RETURN NULL;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS h = PG_EXCEPTION_HINT;
    RETURN h;
END $$;
SELECT alike(pg_temp.hint_of(format('SELECT pepsi.reschedule(%s)', :running)),
    'pepsi-queue requeue --id%', 'the hint names pepsi-queue requeue');
UPDATE pepsi.workqueue SET status = 'done' WHERE workqueue_id = :running;
SELECT throws_ok(format('SELECT pepsi.reschedule(%s)', :running), '55000', NULL, 'a done message is refused');
SELECT throws_ok('SELECT pepsi.reschedule(-1)', 'P0002', NULL, 'an unknown id is refused');
-- A terminal message kept in pepsi.dead_letters is terminal, not unknown.
INSERT INTO pepsi.dead_letters (workqueue_id, stage, status, payload, state, retries,
                                created_at, updated_at, priority)
SELECT workqueue_id, stage, 'failed', payload, state, retries, created_at, updated_at, priority
  FROM pepsi.workqueue WHERE workqueue_id = :running;
DELETE FROM pepsi.workqueue WHERE workqueue_id = :running;
SELECT throws_like(format('SELECT pepsi.reschedule(%s)', :running),
    '%is failed (terminal); requeue it instead%', 'a message kept in dead_letters is refused as terminal');
SELECT throws_ok(format('SELECT pepsi.reschedule(%s)', :running), '55000', NULL,
    'with SQLSTATE 55000, not P0002');
SELECT throws_ok(format('SELECT pepsi.reschedule(%s, ''infinity'')', :pend), '22008', NULL,
                 'a non-finite time is refused');
SELECT is((SELECT timeout FROM pepsi.workqueue WHERE workqueue_id = :pend), now() + interval '5 min',
          'a refusal changes nothing');

-- The dashboard's button.
SELECT is(pepsi.dashboard_reschedule(:pend), now(), 'dashboard_reschedule runs reschedule');

SELECT * FROM finish();
ROLLBACK;
