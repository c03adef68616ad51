-- record_dispatch_error v3: automatic retries from the stage registry's RETRY_DELAY.
BEGIN;
SELECT plan(17);

CREATE FUNCTION pg_temp.running(s text, retries int) RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO pepsi.workqueue (stage, status, dispatcher_id, retries, state)
    VALUES (s, 'running', 1, retries, '{"note": 1}') RETURNING workqueue_id $$;

-- r: retries on (10 s, capped at 60 s, MAX_RETRIES 3); off: no RETRY_DELAY.
SELECT pepsi.register_stages(1, ARRAY['r', 'off', 'zero'], NULL, ARRAY[3, 3, 0],
                             ARRAY[interval '10 s', NULL, interval '1 s'],
                             ARRAY[interval '60 s', NULL, NULL], NULL, NULL);

SELECT pg_temp.running('r', 0) AS r0, pg_temp.running('r', 1) AS r1,
       pg_temp.running('r', 2) AS r2, pg_temp.running('r', 3) AS r3,
       pg_temp.running('off', 0) AS off0, pg_temp.running('unregistered', 0) AS unreg,
       pg_temp.running('zero', 0) AS zero0 \gset

CREATE TEMP TABLE verdict AS
SELECT * FROM pepsi.record_dispatch_error(1,
    ARRAY[:r0, :r1, :r2, :r3, :off0, :unreg, :zero0]::bigint[],
    ARRAY['failed', 'timeout', 'failed', 'failed', 'failed', 'timeout', 'failed'],
    ARRAY['1 boom', 'timeout: slow', 'worker exited with code 3', 'protocol error: x', '2 no', 't', 'z']);

SELECT results_eq('SELECT workqueue_id, status FROM verdict ORDER BY workqueue_id',
    format($$VALUES (%s::bigint, 'paused'::text), (%s, 'paused'), (%s, 'paused'), (%s, 'failed'),
                    (%s, 'failed'), (%s, 'timeout'), (%s, 'failed')$$,
           :r0, :r1, :r2, :r3, :off0, :unreg, :zero0),
    'returns every changed row with its new status: paused while retries remain');
SELECT results_eq(format('SELECT status, dispatcher_id, retries, state FROM pepsi.workqueue WHERE workqueue_id = %s', :r0),
    $$VALUES ('paused'::text, NULL::bigint, 0, '{"note": 1, "retry_error": "1 boom",
              "pause_reason": "automatic retry 1 of 3 after: 1 boom"}'::jsonb)$$,
    'a retried row is paused, released, retries unchanged (requeue_due counts the flip), error kept in retry_error');
SELECT ok((SELECT timeout BETWEEN now() + interval '8 s' AND now() + interval '12 s'
             FROM pepsi.workqueue WHERE workqueue_id = :r0),
          'first retry: RETRY_DELAY ± 20 %');
SELECT ok((SELECT timeout BETWEEN now() + interval '16 s' AND now() + interval '24 s'
             FROM pepsi.workqueue WHERE workqueue_id = :r1),
          'second retry: twice RETRY_DELAY ± 20 % (a timeout retries too)');
SELECT ok((SELECT timeout BETWEEN now() + interval '32 s' AND now() + interval '48 s'
             FROM pepsi.workqueue WHERE workqueue_id = :r2),
          'third retry: four times RETRY_DELAY ± 20 % (a crash retries too)');
SELECT ok((SELECT verdict.timeout FROM verdict WHERE workqueue_id = :r2) =
          (SELECT timeout FROM pepsi.workqueue WHERE workqueue_id = :r2),
          'the result says when the retry is due');
SELECT results_eq(format('SELECT status, state->>''dispatch_error'' FROM pepsi.workqueue WHERE workqueue_id = %s', :r3),
    $$VALUES ('failed'::text, 'protocol error: x'::text)$$,
    'retries used up (retries = MAX_RETRIES): failed as without retries');
SELECT results_eq(format('SELECT status, state->>''dispatch_error'' FROM pepsi.workqueue WHERE workqueue_id IN (%s, %s) ORDER BY 1', :off0, :unreg),
    $$VALUES ('failed'::text, '2 no'::text), ('timeout', 't')$$,
    'no RETRY_DELAY, or a stage not registered: today''s behaviour');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :zero0), 'failed',
          'MAX_RETRIES 0 means no retry even with RETRY_DELAY');

-- The cap: with many retries the delay stays at most RETRY_DELAY_MAX.
SELECT pepsi.register_stages(1, ARRAY['r'], NULL, ARRAY[1000], ARRAY[interval '10 s'],
                             ARRAY[interval '60 s'], NULL, NULL);
SELECT pg_temp.running('r', 500) AS big \gset
SELECT count(*) FROM pepsi.record_dispatch_error(1, ARRAY[:big]::bigint[], ARRAY['failed'], ARRAY['again']);
SELECT ok((SELECT timeout BETWEEN now() + interval '48 s' AND now() + interval '60 s'
             FROM pepsi.workqueue WHERE workqueue_id = :big),
          'a large retries count is capped by RETRY_DELAY_MAX (jitter below it)');
SELECT pepsi.register_stages(1, ARRAY['r'], NULL, ARRAY[1000], ARRAY[interval '1 day'],
                             NULL, NULL, NULL);
SELECT pg_temp.running('r', 999) AS huge \gset
SELECT lives_ok(format($$SELECT count(*) FROM pepsi.record_dispatch_error(1, ARRAY[%s]::bigint[], ARRAY['failed'], ARRAY['x'])$$, :huge),
                'no cap and a huge retries count does not overflow');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :huge), 'paused',
          'and the row is paused (far ahead)');

-- When due, requeue_due flips it with retries + 1; the last failure fails it.
UPDATE pepsi.workqueue SET timeout = now() - interval '1 s' WHERE workqueue_id = :r0;
SELECT is((SELECT requeued FROM pepsi.requeue_due(ARRAY['r'], ARRAY[3], 10, NULL)), 1,
          'the retry is requeued when due');
SELECT results_eq(format('SELECT status, retries FROM pepsi.workqueue WHERE workqueue_id = %s', :r0),
    $$VALUES ('pending'::text, 1)$$, 'pending again with retries 1');

-- Guards stay: not running, or another dispatcher's row, changes nothing.
SELECT is((SELECT count(*)::int FROM pepsi.record_dispatch_error(1, ARRAY[:r0]::bigint[], ARRAY['failed'], ARRAY['x'])),
          0, 'a row that is not running is never touched');
SELECT pg_temp.running('r', 0) AS mine \gset
SELECT is((SELECT count(*)::int FROM pepsi.record_dispatch_error(2, ARRAY[:mine]::bigint[], ARRAY['failed'], ARRAY['x'])),
          0, 'a row another dispatcher holds is never touched (fencing)');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :mine), 'running', 'it stays running');

SELECT * FROM finish();
ROLLBACK;
