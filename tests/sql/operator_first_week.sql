-- What an operator reads of a message is true: show's history never claims
-- a hop the message did not make, a pause reason does not outlive the pause,
-- and a scheduled message names its schedule.
BEGIN;
SELECT plan(6);

SELECT pepsi.register_stages(1, ARRAY['ingest', 'enrich', 'store'], ARRAY['enrich', 'store', ''],
                             ARRAY[3, 3, 3], NULL, NULL, NULL, NULL);
CREATE FUNCTION pg_temp.claim_one(st text) RETURNS bigint LANGUAGE sql AS $$
    SELECT workqueue_id FROM pepsi.claim(1, ARRAY[st], ARRAY[1]) $$;

-- Paused once at ingest, then through enrich to store, then done.
SELECT pepsi.enqueue('ingest', '{}') AS m \gset
SELECT pg_temp.claim_one('ingest');
SELECT pepsi.pause(:m, 'ingest', now() - interval '1 s', 'upstream busy', 1);
SELECT count(*) FROM pepsi.requeue_due(NULL, NULL, NULL, NULL);
SELECT ok(NOT ((SELECT state FROM pepsi.workqueue WHERE workqueue_id = :m) ? 'pause_reason'),
          'a message made pending again loses its pause_reason');
SELECT is((SELECT reason FROM pepsi.attempts WHERE workqueue_id = :m), 'upstream busy',
          'the pause reason stays in its history');
SELECT pg_temp.claim_one('ingest');
SELECT pepsi.advance(:m, 'ingest', 'enrich', 1);
SELECT pg_temp.claim_one('enrich');
SELECT pepsi.advance(:m, 'enrich', 'store', 1);
SELECT results_eq(format('SELECT stage, outcome, reason FROM pepsi.message_history(%s) WHERE attempt IS NULL', :m),
    $$VALUES ('ingest'::text, 'left'::text, 'now at stage store'::text)$$,
    'history says the message left ingest and is now at store, not that ingest advanced it to store');
SELECT pg_temp.claim_one('store');
SELECT pepsi.finish(:m, 'store', 1);
SELECT ok(NOT ((SELECT state FROM pepsi.workqueue WHERE workqueue_id = :m) ? 'pause_reason'),
          'a done message carries no pause_reason');

-- A schedule's message names the schedule.
SELECT pepsi.fire_schedule('nightly', ARRAY[now()], 'ingest') IS NOT NULL;
SELECT is((SELECT state->>'scheduled_by' FROM pepsi.workqueue WHERE state ? 'scheduled_for'),
          'nightly', 'a scheduled message says which schedule made it');
SELECT throws_ok($$SELECT pepsi.set_state(1, 'ingest', '{"scheduled_by": "forged"}')$$, '22023',
                 NULL, 'a stage cannot forge scheduled_by');

SELECT * FROM finish();
ROLLBACK;
