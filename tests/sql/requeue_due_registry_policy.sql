-- pepsi.requeue_due(NULL, NULL, NULL, expiry): the retry policy comes from the stage registry.
BEGIN;
SELECT plan(5);

INSERT INTO pepsi.stages (stage, max_retries) VALUES ('strict', 1), ('lenient', 5);

CREATE FUNCTION pg_temp.paused(s text, retries int) RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO pepsi.workqueue (stage, status, timeout, retries)
    VALUES (s, 'paused', now() - interval '1 s', retries) RETURNING workqueue_id $$;

SELECT pg_temp.paused('strict', 1)   AS strict_out,
       pg_temp.paused('lenient', 1)  AS lenient_again,
       pg_temp.paused('unknown', 9)  AS unknown_again,
       pg_temp.paused('unknown', 10) AS unknown_out
\gset

SELECT results_eq(
    $$SELECT requeued, exhausted, exhausted_stages FROM pepsi.requeue_due(NULL, NULL, NULL, NULL)$$,
    $$VALUES (2, 2, ARRAY['strict', 'unknown'])$$,
    'caps from pepsi.stages; a stage the registry does not know gets 10');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :strict_out), 'failed',
    'MAX_RETRIES 1 in the registry: the second pause fails it');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :lenient_again), 'pending',
    'MAX_RETRIES 5 in the registry: retried');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :unknown_again), 'pending',
    'unregistered stage below the default cap: retried');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :unknown_out), 'failed',
    'unregistered stage at the default cap: failed');

SELECT * FROM finish();
ROLLBACK;
