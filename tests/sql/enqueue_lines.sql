-- pepsi.enqueue_lines: JSON lines parsed, checked and inserted by one call.
BEGIN;
SELECT plan(24);

CREATE TEMP TABLE got AS
SELECT id, row_number() OVER () AS n
  FROM pepsi.enqueue_lines('lines', ARRAY['{"i": 1}', '', '  {"i": 2} ', NULL, E'{"i": 3}\r']) AS id;
SELECT is((SELECT count(*)::int FROM got), 3, 'one id per non-blank line (blank and NULL skipped)');
SELECT ok((SELECT bool_and(m.id > p.id) FROM got m JOIN got p ON p.n = m.n - 1),
          'ids ascend in line order');
SELECT results_eq(
    $$SELECT w.payload, w.status, w.priority, w.dedupe_key
        FROM got g JOIN pepsi.workqueue w ON w.workqueue_id = g.id ORDER BY g.n$$,
    $$VALUES ('{"i": 1}'::jsonb, 'pending'::text, 0, NULL::text), ('{"i": 2}', 'pending', 0, NULL),
             ('{"i": 3}', 'pending', 0, NULL)$$,
    'payloads parsed and stored in line order, pending, priority 0, no key');

-- A bad line: named by number (first_line counts), nothing of the call inserted.
SELECT throws_ok($$SELECT * FROM pepsi.enqueue_lines('lines', ARRAY['{}', '', '{"n": oops}', '[1]'],
                                                     first_line => 101)$$,
                 '22P02', 'line 103 is not JSON: Token "oops" is invalid.',
                 'a line that is not JSON is named by its number');
SELECT throws_ok($$SELECT * FROM pepsi.enqueue_lines('lines', ARRAY['{}', '{"n": 1e999999}', '{}'])$$,
                 '22003', 'line 2 holds a number jsonb cannot store: value overflows numeric format',
                 'a line with a number jsonb cannot hold is named by its number');
SELECT throws_ok($$SELECT * FROM pepsi.enqueue_lines('lines', ARRAY['{"k": "a"}', '{"n": -1e999999}'],
                                                     key_field => 'k', first_line => 7)$$,
                 '22003', 'line 8 holds a number jsonb cannot store: value overflows numeric format',
                 'also with keys');
SELECT throws_ok(format($$SELECT * FROM pepsi.enqueue_lines('lines', ARRAY['{}', %L])$$,
                        '{"deep": ' || repeat('[', 300000) || repeat(']', 300000) || '}'),
                 '54001', NULL, 'a line nested too deeply for jsonb is refused with its own SQLSTATE');
SELECT throws_like(format($$SELECT * FROM pepsi.enqueue_lines('lines', ARRAY['{}', %L])$$,
                          '{"deep": ' || repeat('[', 300000) || repeat(']', 300000) || '}'),
                   'line 2 is nested too deeply for jsonb: %',
                   'and named by its number');
SELECT throws_ok($$SELECT * FROM pepsi.enqueue_lines('lines', ARRAY['{}', '{}', '[1, 2]'])$$,
                 '22023', 'line 3 must be a JSON object, not a JSON array',
                 'a line that is not an object is named by its number');
SELECT throws_ok($$SELECT * FROM pepsi.enqueue_lines('lines', ARRAY['{}', '7'], dedupe_keys => ARRAY['a', 'b'])$$,
                 '22023', 'line 2 must be a JSON object, not a JSON number',
                 'also with keys');
SELECT throws_ok($$SELECT * FROM pepsi.enqueue_lines('lines', ARRAY['{"k": " "}'], key_field => 'k')$$,
                 '22023', NULL, 'a key of only whitespace is refused');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue WHERE stage = 'lines'), 3,
          'refused calls inserted nothing');
SELECT throws_ok($$SELECT * FROM pepsi.enqueue_lines('no good', ARRAY['{}'])$$,
                 '22023', NULL, 'the stage is checked');
SELECT throws_ok($$SELECT * FROM pepsi.enqueue_lines('s', ARRAY['{}'], 'infinity')$$,
                 '22008', NULL, 'not_before must be finite');
SELECT throws_ok($$SELECT * FROM pepsi.enqueue_lines('s', ARRAY['{}', '{}'], dedupe_keys => ARRAY['a'])$$,
                 '22023', NULL, 'dedupe_keys must be aligned with lines');
SELECT throws_ok($$SELECT * FROM pepsi.enqueue_lines('s', ARRAY['{}'], dedupe_keys => ARRAY['a'],
                                                     key_field => 'k')$$,
                 '22023', 'give dedupe_keys or key_field, not both', 'not both kinds of keys');
SELECT is_empty($$SELECT * FROM pepsi.enqueue_lines('s', ARRAY[]::text[])$$, 'no lines: nothing');

-- Priorities and keys.
CREATE TEMP TABLE k1 AS
SELECT id, row_number() OVER () AS n
  FROM pepsi.enqueue_lines('keyed', ARRAY['{"o": "a"}', '{"o": "b"}', '{"o": "a"}', '{}', '{"o": 7}'],
                           priority => 5, key_field => 'o') AS id;
SELECT results_eq($$SELECT count(DISTINCT id)::int, count(*)::int FROM k1$$,
                  $$VALUES (4, 5)$$, 'one id per line; a key twice in the call: one message');
SELECT is((SELECT id FROM k1 WHERE n = 3), (SELECT id FROM k1 WHERE n = 1),
          'the later line of a key gets the earlier line''s id');
SELECT results_eq(
    $$SELECT w.dedupe_key, w.priority FROM k1 JOIN pepsi.workqueue w ON w.workqueue_id = k1.id
       WHERE k1.n IN (1, 2, 4, 5) ORDER BY k1.n$$,
    $$VALUES ('a'::text, 5), ('b', 5), (NULL, 5), ('7', 5)$$,
    'keys from the payload''s field (a number as its text), the priority on every row');
CREATE TEMP TABLE k2 AS
SELECT id, row_number() OVER () AS n
  FROM pepsi.enqueue_lines('keyed', ARRAY['{}', '{}', '{}'], dedupe_keys => ARRAY['b', NULL, 'c']) AS id;
SELECT is((SELECT id FROM k2 WHERE n = 1), (SELECT id FROM k1 WHERE n = 2),
          'a key a live message holds inserts nothing and returns that message''s id');
SELECT ok((SELECT id FROM k2 WHERE n = 3) > (SELECT id FROM k2 WHERE n = 2),
          'the other lines are inserted, in order');
UPDATE pepsi.workqueue SET status = 'done' WHERE dedupe_key = 'c';
SELECT ok((SELECT * FROM pepsi.enqueue_lines('keyed', ARRAY['{"again": true}'], dedupe_keys => ARRAY['c']))
          > (SELECT id FROM k2 WHERE n = 3),
          'a key whose message is terminal is free again');

-- Delayed.
CREATE TEMP TABLE d AS
SELECT id FROM pepsi.enqueue_lines('later', ARRAY['{}'], now() + interval '1 hour') AS id;
SELECT results_eq(
    $$SELECT w.status, w.timeout > now(), w.state ? 'delayed_until'
        FROM d JOIN pepsi.workqueue w ON w.workqueue_id = d.id$$,
    $$VALUES ('paused'::text, true, true)$$,
    'not_before in the future: a delayed message, as enqueue');

SELECT * FROM finish();
ROLLBACK;
