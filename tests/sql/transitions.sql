-- Stage program API: advance, finish, pause, fail.  Each applies only to a
-- row 'running' at from_stage (and held by dispatcher_id when given);
-- otherwise nothing changes and false comes back.
BEGIN;
SELECT plan(44);

-- A running row of stage s held by dispatcher d, with some history.
CREATE FUNCTION pg_temp.running(s text, d bigint) RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO pepsi.workqueue (stage, status, dispatcher_id, retries, state)
    VALUES (s, 'running', d, 2, '{"k": "v"}') RETURNING workqueue_id $$;
CREATE FUNCTION pg_temp.row_of(i bigint) RETURNS TABLE (stage text, status text, retries int,
    dispatcher_id bigint, timeout timestamptz, state jsonb) LANGUAGE sql AS $$
    SELECT stage, status, retries, dispatcher_id, timeout, state
      FROM pepsi.workqueue WHERE workqueue_id = i $$;

SELECT pg_temp.running('fetch', 7) AS adv, pg_temp.running('fetch', 7) AS fin,
       pg_temp.running('fetch', 7) AS pau, pg_temp.running('fetch', 7) AS fai,
       pg_temp.running('fetch', 7) AS fenced, pg_temp.running('fetch', 7) AS untouched
\gset
SELECT pepsi.enqueue('fetch') AS pend \gset

-- advance
SELECT is(pepsi.advance(:adv, 'parse', 'store', 7), false, 'advance refuses a wrong from_stage');
SELECT is(pepsi.advance(:adv, 'fetch', 'store', 8), false, 'advance refuses a wrong dispatcher');
SELECT is(pepsi.advance(:pend, 'fetch', 'store'), false, 'advance refuses a pending row');
SELECT is(pepsi.advance(NULL, 'fetch', 'store'), false, 'advance of a NULL id changes nothing');
SELECT is(pepsi.advance(:adv, NULL, 'store'), false, 'advance from a NULL stage changes nothing');
SELECT is(pepsi.advance(-1, 'fetch', 'store'), false, 'advance of a missing id returns false');
SELECT throws_ok(format('SELECT pepsi.advance(%s, %L, %L)', :adv, 'fetch', 'st ore'), '22023',
                 NULL, 'advance refuses a bad to_stage name');
SELECT throws_ok(format('SELECT pepsi.advance(%s, %L, NULL)', :adv, 'fetch'), '22023',
                 NULL, 'advance refuses a NULL to_stage');
SELECT results_eq(format('SELECT * FROM pg_temp.row_of(%s)', :adv),
    $$VALUES ('fetch'::text, 'running'::text, 2, 7::bigint, NULL::timestamptz, '{"k": "v"}'::jsonb)$$,
    'refused advances left the row as it was');
SELECT is(pepsi.advance(:adv, 'fetch', 'store', 7), true, 'advance moves a running row');
SELECT results_eq(format('SELECT * FROM pg_temp.row_of(%s)', :adv),
    $$VALUES ('store'::text, 'pending'::text, 0, NULL::bigint, NULL::timestamptz, '{"k": "v"}'::jsonb)$$,
    'advance sets stage, status pending, retries 0, no dispatcher; keeps state');
SELECT is(pepsi.advance(:adv, 'fetch', 'store', 7), false, 'advance twice: the second is refused');
SELECT is(pepsi.advance(:untouched, 'fetch', 'store'), true,
          'advance without a dispatcher_id needs no fencing token');

-- finish
SELECT is(pepsi.finish(:fin, 'parse', 7), false, 'finish refuses a wrong from_stage');
SELECT is(pepsi.finish(:fin, 'fetch', 8), false, 'finish refuses a wrong dispatcher');
SELECT is(pepsi.finish(:pend, 'fetch'), false, 'finish refuses a pending row');
SELECT is(pepsi.finish(NULL, 'fetch'), false, 'finish of a NULL id changes nothing');
SELECT is(pepsi.finish(:fin, 'fetch', 7), true, 'finish marks a running row');
SELECT results_eq(format('SELECT status, dispatcher_id FROM pg_temp.row_of(%s)', :fin),
    $$VALUES ('done'::text, NULL::bigint)$$, 'finish sets done and clears the dispatcher');
SELECT is(pepsi.finish(:fin, 'fetch', 7), false, 'finish of a done row is refused');

-- pause
SELECT is(pepsi.pause(:pau, 'parse', now() + interval '1 min', 'later', 7), false,
          'pause refuses a wrong from_stage');
SELECT is(pepsi.pause(:pau, 'fetch', now() + interval '1 min', 'later', 8), false,
          'pause refuses a wrong dispatcher');
SELECT is(pepsi.pause(:pend, 'fetch', now() + interval '1 min'), false,
          'pause refuses a pending row');
SELECT throws_ok(format('SELECT pepsi.pause(%s, %L, NULL)', :pau, 'fetch'), '22004', NULL,
                 'pause refuses a NULL until');
SELECT is(pepsi.pause(:pau, 'fetch', '2030-01-01T00:00:00Z', 'rate limited', 7), true,
          'pause parks a running row');
SELECT results_eq(format('SELECT status, timeout, dispatcher_id, retries, state FROM pg_temp.row_of(%s)', :pau),
    $$VALUES ('paused'::text, '2030-01-01T00:00:00Z'::timestamptz, NULL::bigint, 2,
              '{"k": "v", "pause_reason": "rate limited"}'::jsonb)$$,
    'pause sets paused, the timeout and the reason; keeps retries');
SELECT is(pepsi.pause(:pau, 'fetch', now(), NULL, 7), false, 'pause of a paused row is refused');

-- fail
SELECT is(pepsi.fail(:fai, 'parse', 'x', 7), false, 'fail refuses a wrong from_stage');
SELECT is(pepsi.fail(:fai, 'fetch', 'x', 8), false, 'fail refuses a wrong dispatcher');
SELECT is(pepsi.fail(:pend, 'fetch', 'x'), false, 'fail refuses a pending row');
SELECT is(pepsi.fail(:fai, 'fetch', 'bad input', 7), true, 'fail marks a running row');
SELECT results_eq(format('SELECT status, dispatcher_id, state FROM pg_temp.row_of(%s)', :fai),
    $$VALUES ('failed'::text, NULL::bigint, '{"k": "v", "error": "bad input"}'::jsonb)$$,
    'fail sets failed with the reason in state.error');
SELECT is(pepsi.fail(:fai, 'fetch', 'again', 7), false, 'fail of a failed row is refused');
SELECT is(pepsi.fail(:fenced, 'fetch', NULL), true, 'fail with a NULL reason still fails');
SELECT is((SELECT state->>'error' FROM pepsi.workqueue WHERE workqueue_id = :fenced),
          'failed without a reason', 'a NULL reason is stored as a placeholder');

-- Fencing: a worker whose dispatcher lost the row cannot write it.
SELECT pg_temp.running('fetch', 7) AS lost \gset
UPDATE pepsi.workqueue SET status = 'pending', dispatcher_id = NULL WHERE workqueue_id = :lost;
UPDATE pepsi.workqueue SET status = 'running', dispatcher_id = 9 WHERE workqueue_id = :lost;
SELECT is(pepsi.advance(:lost, 'fetch', 'store', 7), false, 'fenced: advance by the old holder');
SELECT is(pepsi.finish(:lost, 'fetch', 7), false, 'fenced: finish by the old holder');
SELECT is(pepsi.pause(:lost, 'fetch', now(), NULL, 7), false, 'fenced: pause by the old holder');
SELECT is(pepsi.fail(:lost, 'fetch', 'x', 7), false, 'fenced: fail by the old holder');
SELECT is(pepsi.set_state(:lost, 'fetch', '{"a": 1}', 7), false, 'fenced: set_state by the old holder');
SELECT results_eq(format('SELECT status, dispatcher_id FROM pg_temp.row_of(%s)', :lost),
    $$VALUES ('running'::text, 9::bigint)$$, 'the new holder still has the row');
SELECT is(pepsi.finish(:lost, 'fetch', 9), true, 'the new holder can finish it');

-- Terminal rows stay terminal.
SELECT is(pepsi.advance(:fin, 'fetch', 'store'), false, 'a done row cannot be advanced');
SELECT is(pepsi.advance(:fai, 'fetch', 'store'), false, 'a failed row cannot be advanced');

SELECT * FROM finish();
ROLLBACK;
