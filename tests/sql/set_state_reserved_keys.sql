-- set_state v3: a stage cannot write the state keys the queue reserves, so it
-- cannot mark its own message delayed and opt it out of MAX_RETRIES and EXPIRY.
-- Against set_state v2 the first, third and fifth tests fail (delayed_until was
-- accepted, and requeue_due then flipped the paused row back without a retry).
BEGIN;
SELECT plan(9);

CREATE FUNCTION pg_temp.running(s text) RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO pepsi.workqueue (stage, status, dispatcher_id, state)
    VALUES (s, 'running', 7, '{"k": "v"}') RETURNING workqueue_id $$;

CREATE FUNCTION pg_temp.refused(q text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN false;
EXCEPTION WHEN invalid_parameter_value THEN
    RETURN true;
END $$;

SELECT pg_temp.running('s') AS a, pg_temp.running('s') AS b, pg_temp.running('old') AS c \gset

SELECT throws_ok(format($$SELECT pepsi.set_state(%s, 's', '{"delayed_until": "2030-01-01", "x": 1}', 7)$$, :a),
                 '22023', NULL,
                 'set_state refuses delayed_until: only enqueue marks a message delayed');
SELECT is((SELECT state FROM pepsi.workqueue WHERE workqueue_id = :a), '{"k": "v"}'::jsonb,
          'a refused patch writes nothing, not even its other keys');

-- A stage that tried and then pauses still uses up MAX_RETRIES (0 here).
SELECT pepsi.pause(:a, 's', now() - interval '1 s', 'again', 7);
SELECT requeued, exhausted FROM pepsi.requeue_due(ARRAY['s'], ARRAY[0], 10, NULL);
SELECT results_eq(format('SELECT status, retries, state->>''dispatch_error'' FROM pepsi.workqueue WHERE workqueue_id = %s', :a),
    $$VALUES ('failed'::text, 0, 'retries exhausted'::text)$$,
    'a pause by a stage that tried to write delayed_until counts against MAX_RETRIES');

-- Every reserved key is refused, with a message naming the key.
SELECT is(pepsi._reserved_state_keys(),
          ARRAY['dispatch_error', 'delayed_until', 'retry_error', 'previous_error', 'cancelled_status',
                'scheduled_for', 'scheduled_by'],
          'the reserved keys, listed once');
SELECT ok(bool_and(r.refused), 'set_state refuses each reserved key (22023)')
  FROM (SELECT k, pg_temp.refused(format('SELECT pepsi.set_state(%s, ''s'', %L::jsonb, 7)', :b,
                                         jsonb_build_object(k, 'x'))) AS refused
          FROM unnest(pepsi._reserved_state_keys()) AS k) AS r;
SELECT throws_like(format($$SELECT pepsi.set_state(%s, 's', '{"retry_error": 1, "dispatch_error": 2}', 7)$$, :b),
                   'reserved state keys in patch: dispatch_error, retry_error %',
                   'the error names the reserved keys of the patch');
SELECT is(pepsi.set_state(:b, 's', '{"k": "w", "error_hint": "fine"}', 7), true,
          'other keys are still written');

-- A running row whose state already carries a forged mark (written through
-- set_state v2 before the upgrade) lost it in the migration; a delayed row that
-- is still waiting keeps its mark.
SELECT ok(NOT EXISTS (SELECT 1 FROM pepsi.workqueue WHERE status = 'running' AND state ? 'delayed_until'),
          'no running row carries delayed_until after the upgrade');
SELECT pepsi.enqueue('s', '{}', now() + interval '1 h') AS d \gset
SELECT ok((SELECT state ? 'delayed_until' FROM pepsi.workqueue WHERE workqueue_id = :d),
          'enqueue with a future not_before still marks the message delayed');

SELECT * FROM finish();
ROLLBACK;
