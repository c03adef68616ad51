-- Stage health from the heartbeat (stage_health), series at zero, the stage
-- registry and failure groups in dashboard_snapshot v4, the dashboard's
-- message list (list_messages v2: kind, reason_group) and _normalise_reason.
BEGIN;
SELECT plan(32);

SELECT ok(has_function_privilege('pepsi_dispatcher', 'pepsi.stage_health()', 'EXECUTE'),
          'pepsi_dispatcher executes stage_health (pepsi-queue status)');
SELECT ok(has_function_privilege('pepsi_dashboard',
              'pepsi.list_messages(text[], text, interval, jsonb, bigint, integer, text)', 'EXECUTE')
      AND NOT has_function_privilege('pepsi_stage',
              'pepsi.list_messages(text[], text, interval, jsonb, bigint, integer, text)', 'EXECUTE')
      AND NOT has_function_privilege('public', 'pepsi._normalise_reason(text)', 'EXECUTE'),
          'list_messages is the dashboard''s, not a stage''s; _normalise_reason nobody''s directly');

-- _normalise_reason
SELECT is(pepsi._normalise_reason('bad input n=201'), 'bad input n=<n>', 'numbers masked');
SELECT is(pepsi._normalise_reason('bad input n=201'), pepsi._normalise_reason('bad input n=202'),
          'reasons that differ only in a number are one group');
SELECT is(pepsi._normalise_reason('1 RuntimeError: upstream exploded'), 'RuntimeError: upstream exploded',
          'the protocol''s answer code is dropped');
SELECT is(pepsi._normalise_reason('object 123e4567-e89b-12d3-a456-426614174000 at 0xDEAD, sha 3f2a9c1b0d'),
          'object <uuid> at <hex>, sha <hex>', 'uuids and hex masked');
SELECT is(pepsi._normalise_reason('utf8  codec   201ms'), 'utf8 codec <n>ms',
          'digits inside a word stay; white space folded');
SELECT is(pepsi._normalise_reason(NULL), NULL, 'NULL in, NULL out');

-- The registry: a, b (b final); c has rows but is not registered.
SELECT pepsi.register_dispatcher('h', 1, false) AS d \gset
SELECT pepsi.register_stages(:d, ARRAY['a', 'b'], ARRAY['b', ''], NULL, NULL, NULL,
                             ARRAY[2, 3], ARRAY[4, 5]);
INSERT INTO pepsi.workqueue (stage, status, updated_at) VALUES
    ('a', 'pending', now() - interval '120 s'), ('a', 'pending', now()), ('c', 'done', now());

-- No health reported yet: unknown.
SELECT results_eq($$SELECT stage, state, pending FROM pepsi.stage_health()$$,
                  $$VALUES ('a'::text, 'unknown'::text, 2::bigint), ('b', 'unknown', 0)$$,
                  'registered stages are unknown until a live dispatcher reports them');

-- A live dispatcher reports a held off, b serving.
SELECT pepsi.heartbeat(:d, '{"heartbeat_interval": 30, "stages": {
    "a": {"state": "held_off", "cause": "PROGRAM /x/gone cannot start: No such file", "held_seconds": 90},
    "b": {"state": "serving"}}}');
SELECT results_eq($$SELECT stage, state, cause, pending, dispatchers FROM pepsi.stage_health()$$,
                  $$VALUES ('a'::text, 'held_off'::text, 'PROGRAM /x/gone cannot start: No such file'::text,
                            2::bigint, 1::bigint),
                           ('b', 'serving', NULL, 0, 1)$$,
                  'health as the heartbeat reported it, with the cause and the pending rows');
SELECT ok((SELECT held_seconds BETWEEN 89 AND 100 FROM pepsi.stage_health() WHERE stage = 'a'),
          'held_seconds runs from the heartbeat time minus the reported hold');
SELECT ok((SELECT abs(extract(epoch FROM since - (now() - interval '90 s'))) < 5
             FROM pepsi.stage_health() WHERE stage = 'a'),
          'since = heartbeat time - held_seconds');
SELECT is((SELECT since FROM pepsi.stage_health() WHERE stage = 'b'), NULL,
          'a serving stage has no since');

-- A second live dispatcher reports a as no_worker: the worse state wins.
SELECT pepsi.register_dispatcher('h2', 2, true) AS d2 \gset
SELECT pepsi.heartbeat(:d2, '{"heartbeat_interval": 30, "stages": {
    "a": {"state": "no_worker", "cause": "worker exited 3 before answering", "held_seconds": 10},
    "b": {"state": "bogus", "held_seconds": "x"},
    "z": {"state": "paused"}}}');
SELECT results_eq($$SELECT stage, state, cause, dispatchers FROM pepsi.stage_health()$$,
                  $$VALUES ('a'::text, 'no_worker'::text, 'worker exited 3 before answering'::text, 2::bigint),
                           ('b', 'serving', NULL, 2),
                           ('z', 'paused', NULL, 1)$$,
                  'worst state wins; an unknown state reads as serving; unregistered stages reported too');

-- A dead dispatcher (its session, and the liveness lock it held, gone) is not heard.
SELECT pg_advisory_unlock(1885629558, (:d2 & 2147483647)::int);
SELECT is((SELECT state FROM pepsi.stage_health() WHERE stage = 'a'), 'held_off',
          'a dispatcher that is not live does not count');
SELECT is((SELECT count(*)::int FROM pepsi.stage_health() WHERE stage = 'z'), 0,
          'nor do the stages only it reported');

-- dashboard_snapshot v4
SELECT pepsi.dashboard_snapshot() AS snap \gset
SELECT is(jsonb_array_length(:'snap'::jsonb -> 'queue'), 21,
          'queue: 3 stages (a, b registered; c has rows) x 7 statuses');
SELECT ok((:'snap'::jsonb -> 'queue') @> '[{"stage": "b", "status": "pending", "count": 0, "oldest_age": 0},
                                          {"stage": "c", "status": "failed", "count": 0}]',
          'zeros are exported for an empty stage and status');
SELECT ok((SELECT (e ->> 'oldest_age')::float8 BETWEEN 119 AND 200
             FROM jsonb_array_elements(:'snap'::jsonb -> 'queue') AS e
            WHERE e ->> 'stage' = 'a' AND e ->> 'status' = 'pending'),
          'oldest_age of a stage and status');
SELECT is(:'snap'::jsonb -> 'oldest_pending', '{"a": 0, "b": 0, "c": 0}'::jsonb - 'a'
              || jsonb_build_object('a', :'snap'::jsonb -> 'oldest_pending' -> 'a'),
          'oldest_pending for every stage, 0 when nothing is pending');
SELECT is(:'snap'::jsonb -> 'retries_due', '{"a": 0, "b": 0, "c": 0}', 'retries_due zeros');
SELECT is(:'snap'::jsonb -> 'stages',
          '[{"stage": "a", "next": ["b"], "parallelism": 2, "queue_limit": 4, "max_retries": 10},
            {"stage": "b", "next": [], "parallelism": 3, "queue_limit": 5, "max_retries": 10}]',
          'the stage registry, for the graph');
SELECT is((SELECT e ->> 'state' FROM jsonb_array_elements(:'snap'::jsonb -> 'stage_health') AS e
            WHERE e ->> 'stage' = 'a'), 'held_off', 'stage_health in the snapshot');

-- failure groups by normalised reason
INSERT INTO pepsi.workqueue (stage, status, state) VALUES
    ('b', 'failed', '{"error": "bad input n=201"}'), ('b', 'failed', '{"error": "bad input n=202"}'),
    ('b', 'failed', '{"error": "bad input n=202"}'), ('b', 'timeout', '{"dispatch_error": "timeout after 3 s"}');
SELECT is((pepsi.dashboard_snapshot() -> 'failure_reasons' -> 0) - 'newest_id',
          '{"stage": "b", "reason": "bad input n=<n>", "count": 3,
            "raw": [{"reason": "bad input n=202", "count": 2}, {"reason": "bad input n=201", "count": 1}]}',
          'one group for reasons differing in a number, the raw reasons with it');

-- the dashboard's message list: list_messages
INSERT INTO pepsi.workqueue (stage, status, timeout, state, payload) VALUES
    ('a', 'paused', now() + interval '1 h', '{"delayed_until": "2099-01-01"}', '{"customer": 7}'),
    ('a', 'paused', now() + interval '1 h', '{"pause_reason": "busy"}', '{"customer": 8}'),
    ('b', 'failed', NULL, '{"error": "cancelled by operator", "cancelled_status": "pending"}', '{}');
SELECT results_eq($$SELECT kind, reason FROM pepsi.list_messages(ARRAY['paused'])$$,
                  $$VALUES ('retry wait'::text, 'busy'::text), ('delayed', NULL)$$,
                  'paused rows say which kind: delayed or retry wait, newest first');
SELECT ok((SELECT bool_and(due > now()) FROM pepsi.list_messages(ARRAY['paused'])),
          'a paused row has its due time');
SELECT is((SELECT kind FROM pepsi.list_messages(in_stage => 'b', max_rows => 1)), 'cancelled',
          'a cancelled message is cancelled, not a plain failure');
SELECT results_eq($$SELECT payload::text FROM pepsi.list_messages(payload_contains => '{"customer": 7}')$$,
                  $$VALUES ('{"customer": 7}'::text)$$, 'payload containment');
SELECT is((SELECT count(*)::int FROM pepsi.list_messages(reason_group => 'bad input n=<n>')), 3,
          'rows of one failure group');
SELECT is((SELECT count(*)::int FROM pepsi.list_messages(ARRAY['pending'], 'a',
                                                           older_than => '1 min')), 1,
          'older_than by updated_at');
SELECT results_eq($$SELECT count(*)::int FROM pepsi.list_messages(max_rows => 2)
                    UNION ALL SELECT count(*)::int FROM pepsi.list_messages(
                        before_id => (SELECT min(workqueue_id) FROM pepsi.list_messages(max_rows => 2)))$$,
                  $$VALUES (2), (8)$$, 'max_rows and keyset paging by before_id');
UPDATE pepsi.dispatchers SET gauges = '{"heartbeat_interval": 30, "stages": {"a": {"state": "paused"}}}'
 WHERE dispatcher_id = :d;
SELECT is((SELECT array_agg(DISTINCT kind) FROM pepsi.list_messages(ARRAY['pending'], 'a')),
          ARRAY['stage paused'], 'pending rows of a paused stage say so');

SELECT * FROM finish();
ROLLBACK;
