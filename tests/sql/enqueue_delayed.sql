-- pepsi.enqueue / enqueue_many with not_before: delayed messages wait as
-- paused rows and are not retries.
BEGIN;
SELECT plan(16);

SELECT pepsi.enqueue('d', '{"n": 1}', now() + interval '10 min') AS later,
       pepsi.enqueue('d', '{"n": 2}', now() - interval '1 min') AS past,
       pepsi.enqueue('d', '{"n": 3}', NULL) AS plain,
       pepsi.enqueue('d', '{"n": 4}') AS two_args \gset

SELECT results_eq(format('SELECT status, timeout, retries, state FROM pepsi.workqueue WHERE workqueue_id = %s', :later),
    $$VALUES ('paused'::text, now() + interval '10 min', 0,
              jsonb_build_object('delayed_until', now() + interval '10 min'))$$,
    'a future not_before: paused until then, retries 0, marked delayed');
SELECT results_eq(
    format('SELECT status, timeout, state FROM pepsi.workqueue WHERE workqueue_id IN (%s, %s, %s) ORDER BY 1',
           :past, :plain, :two_args),
    $$VALUES ('pending'::text, NULL::timestamptz, '{}'::jsonb), ('pending', NULL, '{}'), ('pending', NULL, '{}')$$,
    'a past or NULL not_before, or none, is pending at once');
SELECT throws_ok($$SELECT pepsi.enqueue('d', '{}', 'infinity')$$, '22008', NULL,
                 'enqueue refuses not_before = infinity');
SELECT throws_ok($$SELECT * FROM pepsi.enqueue_many('d', ARRAY['{}']::jsonb[], '-infinity')$$, '22008', NULL,
                 'enqueue_many refuses a non-finite not_before');

CREATE TEMP TABLE many AS
SELECT id FROM pepsi.enqueue_many('m', ARRAY['{"i": 1}', '{"i": 2}']::jsonb[], now() + interval '1 h') AS id;
SELECT is((SELECT count(*)::int FROM pepsi.workqueue w JOIN many ON w.workqueue_id = many.id
            WHERE w.status = 'paused' AND w.timeout = now() + interval '1 h' AND w.state ? 'delayed_until'),
          2, 'enqueue_many with not_before delays every row');
SELECT is((SELECT count(*)::int FROM pepsi.enqueue_many('m', ARRAY['{}']::jsonb[])), 1,
          'enqueue_many keeps working with 2 arguments');

-- Not due yet: requeue_due leaves it and reports when it is due.
SELECT is((SELECT next_due FROM pepsi.requeue_due(ARRAY['d'], ARRAY[0], 10, interval '1 day')),
          now() + interval '10 min', 'requeue_due reports the delayed row''s due time');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :later), 'paused',
          'before not_before the row stays paused');

-- Due: flipped to pending without a retry, even with MAX_RETRIES 0 and an
-- old created_at (a delay is not a retry and does not expire).
UPDATE pepsi.workqueue SET timeout = now() - interval '1 s', created_at = now() - interval '3 days'
 WHERE workqueue_id = :later;
SELECT results_eq($$SELECT requeued, exhausted, expired FROM pepsi.requeue_due(ARRAY['d'], ARRAY[0], 0, interval '1 day')$$,
    $$VALUES (1, 0, 0)$$, 'a due delayed row is requeued, never exhausted or expired');
SELECT results_eq(format('SELECT status, retries, timeout, state FROM pepsi.workqueue WHERE workqueue_id = %s', :later),
    $$VALUES ('pending'::text, 0, NULL::timestamptz, '{}'::jsonb)$$,
    'it is pending with retries still 0 and the mark removed');

-- Once running, a pause by the stage counts as usual.
UPDATE pepsi.workqueue SET status = 'running', dispatcher_id = 1 WHERE workqueue_id = :later;
SELECT pepsi.pause(:later, 'd', now() - interval '1 s');
SELECT is((SELECT requeued FROM pepsi.requeue_due(ARRAY['d'], ARRAY[5], 10, NULL)), 1,
          'a later pause by the stage is requeued');
SELECT is((SELECT retries FROM pepsi.workqueue WHERE workqueue_id = :later), 1,
          'and that one counts a retry');

-- Cancelling a delayed row removes the mark; requeue_failed then makes it plain pending.
SELECT pepsi.enqueue('c', '{}', now() + interval '1 h') AS c1 \gset
SELECT is(pepsi.cancel(ARRAY[:c1]::bigint[]), 1, 'a delayed row can be cancelled');
SELECT ok(NOT (SELECT state ? 'delayed_until' FROM pepsi.workqueue WHERE workqueue_id = :c1),
          'a cancelled delayed row loses the mark');

-- Grants: producers and stage programs may delay.
SET LOCAL ROLE pepsi_ingress;
SELECT ok(pepsi.enqueue('d', '{}', now() + interval '1 min') > 0, 'ingress can enqueue with not_before');
RESET ROLE;
SET LOCAL ROLE pepsi_stage;
SELECT ok((SELECT count(*) FROM pepsi.enqueue_many('d', ARRAY['{}']::jsonb[], now() + interval '1 min')) = 1,
          'a stage can enqueue_many with not_before');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
