-- pepsi.list_messages (migration 0018; v2, 0028: the dashboard's list too):
-- every filter, keyset paging, the one cap, kind, and the plans of its
-- statements on a million rows (an index, never a Seq Scan).
BEGIN;
SELECT plan(21);

-- Row 1 was created long ago but moved a minute ago: older_than goes by updated_at.
INSERT INTO pepsi.workqueue (stage, status, payload, state, created_at, updated_at) VALUES
    ('a', 'pending', '{"customer": 7, "k": 1}', '{}', now() - interval '2 h', now() - interval '2 h'),
    ('a', 'pending', '{"customer": 8}', '{}', now() - interval '3 h', now() - interval '1 min'),
    ('b', 'failed', '{"customer": 7}', '{"error": "bad input n=3"}', now() - interval '50 min', now() - interval '30 min'),
    ('b', 'done', '{}', '{}', now() - interval '10 min', now() - interval '10 min');
INSERT INTO pepsi.workqueue (stage, status, timeout, state)
VALUES ('a', 'paused', now() + interval '5 min', '{"pause_reason": "later"}');
SELECT min(workqueue_id) AS first FROM pepsi.workqueue \gset

SELECT results_eq('SELECT workqueue_id - ' || :first || ' FROM pepsi.list_messages()',
    $$VALUES (4::bigint), (3), (2), (1), (0)$$, 'no filter: every message, newest first');
SELECT results_eq($$SELECT workqueue_id - $$ || :first || $$ FROM pepsi.list_messages(ARRAY['pending'])$$,
    $$VALUES (1::bigint), (0)$$, 'by status');
SELECT results_eq($$SELECT workqueue_id - $$ || :first || $$ FROM pepsi.list_messages(ARRAY['pending', 'done'])$$,
    $$VALUES (3::bigint), (1), (0)$$, 'by several statuses');
SELECT results_eq($$SELECT workqueue_id - $$ || :first || $$ FROM pepsi.list_messages(NULL, 'b')$$,
    $$VALUES (3::bigint), (2)$$, 'by stage');
SELECT results_eq($$SELECT workqueue_id - $$ || :first || $$ FROM pepsi.list_messages(older_than => interval '45 min')$$,
    $$VALUES (0::bigint)$$, 'older than: last updated before, whenever created');
SELECT results_eq($$SELECT workqueue_id - $$ || :first || $$ FROM pepsi.list_messages(payload_contains => '{"customer": 7}')$$,
    $$VALUES (2::bigint), (0)$$, 'payload containment');
SELECT results_eq($$SELECT workqueue_id - $$ || :first || $$ FROM pepsi.list_messages(max_rows => 2)$$,
    $$VALUES (4::bigint), (3)$$, 'limit');
SELECT results_eq(format('SELECT workqueue_id - %s FROM pepsi.list_messages(before_id => %s, max_rows => 2)', :first, :first + 3),
    $$VALUES (2::bigint), (1)$$, 'keyset: the next page starts before the last id');
SELECT results_eq($$SELECT status, reason, due IS NOT NULL FROM pepsi.list_messages(ARRAY['paused', 'failed'])$$,
    $$VALUES ('paused'::text, 'later'::text, true), ('failed', 'bad input n=3', false)$$,
    'reason and due');
SELECT throws_ok($$SELECT * FROM pepsi.list_messages(ARRAY['pendin'])$$, '22023', NULL, 'unknown status refused');
SELECT throws_ok($$SELECT * FROM pepsi.list_messages(max_rows => 0)$$, '22023', NULL, 'max_rows out of range refused');
SELECT lives_ok($$SELECT * FROM pepsi.list_messages(max_rows => 10000)$$, 'the cap: 10,000 rows');
SELECT throws_ok($$SELECT * FROM pepsi.list_messages(max_rows => 10001)$$, '22023', NULL, 'one more is refused');
SELECT results_eq($$SELECT workqueue_id - $$ || :first || $$ FROM pepsi.list_messages(reason_group => 'bad input n=<n>')$$,
    $$VALUES (2::bigint)$$, 'a failure group (normalised reason)');
INSERT INTO pepsi.workqueue (stage, status, timeout, state) VALUES
    ('a', 'paused', now() + interval '5 min', '{"delayed_until": "2099-01-01"}'),
    ('b', 'failed', NULL, '{"error": "cancelled by operator", "cancelled_status": "pending"}');
SELECT results_eq($$SELECT workqueue_id - $$ || :first || $$, kind FROM pepsi.list_messages()$$,
    $$VALUES (6::bigint, 'cancelled'::text), (5, 'delayed'), (4, 'retry wait'), (3, 'done'), (2, 'failed'),
             (1, 'pending'), (0, 'pending')$$,
    'kind: cancelled, delayed, retry wait, else the status');

-- A million rows: every filter's statement walks an index.
INSERT INTO pepsi.workqueue (stage, status, payload, created_at, updated_at, dispatcher_id, timeout)
SELECT 's' || (g % 5), st, jsonb_build_object('customer', g % 1000),
       now() - make_interval(secs => 1000000 - g), now() - make_interval(secs => 1000000 - g),
       CASE WHEN st = 'running' THEN 1 END, CASE WHEN st = 'paused' THEN now() END
  FROM generate_series(1, 1000000) AS g
 CROSS JOIN LATERAL (SELECT CASE WHEN g % 100 = 0 THEN 'failed' WHEN g % 100 = 1 THEN 'pending'
                                 WHEN g % 100 = 2 THEN 'paused' WHEN g % 1000 = 3 THEN 'running'
                                 ELSE 'done' END AS st) AS s;
ANALYZE pepsi.workqueue;

CREATE FUNCTION pg_temp.plan_of(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    line text;
    out text := '';
BEGIN
    FOR line IN EXECUTE 'EXPLAIN ' || q LOOP
        out := out || line || E'\n';
    END LOOP;
    RETURN out;
END $$;
CREATE FUNCTION pg_temp.walks_index(statuses text[], st text, older interval, pc jsonb, before bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    p text := pg_temp.plan_of(pepsi._list_messages_sql(statuses, st, older, pc, before, 50));
BEGIN
    IF p LIKE '%Seq Scan on workqueue%' OR p NOT LIKE '%Index%' THEN
        RAISE WARNING 'plan: %', p;
        RETURN false;
    END IF;
    RETURN true;
END $$;

SELECT ok(pg_temp.walks_index(NULL, NULL, NULL, NULL, NULL), '1M rows, no filter: an index, no Seq Scan');
SELECT ok(pg_temp.walks_index(ARRAY['pending'], 's1', NULL, NULL, 900000), '1M rows, status and stage, keyset: an index');
SELECT ok(pg_temp.walks_index(ARRAY['failed'], NULL, NULL, NULL, NULL), '1M rows, failed: an index');
SELECT ok(pg_temp.walks_index(NULL, NULL, interval '10 days', NULL, NULL), '1M rows, older than: an index');
SELECT ok(pg_temp.walks_index(ARRAY['done'], 's3', interval '1 day', '{"customer": 7}', 500000),
          '1M rows, every filter at once: an index');
SELECT ok(pg_temp.plan_of(pepsi._list_messages_sql(NULL, NULL, NULL, NULL, NULL, 50, 'x n=<n>'))
          !~ 'Seq Scan on workqueue', '1M rows, a failure group: an index, no Seq Scan');

SELECT * FROM finish();
ROLLBACK;
