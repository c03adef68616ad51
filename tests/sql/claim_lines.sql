-- pepsi.claim_lines: the claim (same rows, order, writes as pepsi.claim) that
-- also returns each claimed row as the line a worker that takes rows on its
-- pipe reads (ID, STAGE, RETRIES, PAYLOAD, STATE separated by tabs), within
-- each stage's line limit; pepsi.claim (v9) is the same claim without lines.
BEGIN;
SELECT plan(14);

SELECT pepsi.enqueue('rl', '{"text": "tab\there\nnewline \"quoted\" \u00fc\u00f1"}') AS odd,
       pepsi.enqueue('rl', jsonb_build_object('big', repeat('x', 5000))) AS big,
       pepsi.enqueue('rl2', '{"n": 2}') AS other \gset
UPDATE pepsi.workqueue SET retries = 3, state = '{"k": [1, 2]}' WHERE workqueue_id = :odd;

CREATE TEMP TABLE got AS
SELECT * FROM pepsi.claim_lines(7, ARRAY['rl', 'rl2'], ARRAY[10, 10], false, NULL,
                                ARRAY[4096, 0]);

SELECT results_eq('SELECT workqueue_id FROM got',
                  format('VALUES (%s::bigint), (%s), (%s)', :odd, :big, :other),
                  'the rows of pepsi.claim, in its order (stage, priority, id)');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue
            WHERE stage IN ('rl', 'rl2') AND status = 'running' AND dispatcher_id = 7), 3,
          'the rows are claimed: running, held by the dispatcher');
SELECT is((SELECT line FROM got WHERE workqueue_id = :odd),
          (SELECT workqueue_id || E'\t' || stage || E'\t3\t' || payload::text || E'\t'
                  || state::text FROM pepsi.workqueue WHERE workqueue_id = :odd),
          'a row line: id, stage, retries, payload and state as jsonb text, tab-separated');
SELECT is((SELECT array_length(string_to_array(line, E'\t'), 1) FROM got
            WHERE workqueue_id = :odd), 5,
          'a tab or newline inside a string of the payload is escaped: five fields');
SELECT ok((SELECT strpos(line, E'\n') = 0 FROM got WHERE workqueue_id = :odd),
          'a row line holds no newline');
SELECT is((SELECT split_part(line, E'\t', 4)::jsonb FROM got WHERE workqueue_id = :odd),
          (SELECT payload FROM pepsi.workqueue WHERE workqueue_id = :odd),
          'the payload field reads back as the stored payload');
SELECT is((SELECT line FROM got WHERE workqueue_id = :big), NULL,
          'a line longer than its stage''s limit is not returned (the bare id goes out)');
SELECT is((SELECT line FROM got WHERE workqueue_id = :other), NULL,
          'a stage whose limit is 0 gets no lines');

SELECT pepsi.enqueue('rl', '{"n": 4}') AS plain \gset
SELECT is((SELECT line FROM pepsi.claim_lines(7, ARRAY['rl'], ARRAY[10])), NULL,
          'no line_limits: no lines');

SELECT pepsi.enqueue('rl', '{"n": 5}') AS via_claim \gset
SELECT results_eq(format('SELECT workqueue_id, stage, priority FROM pepsi.claim(7, ARRAY[''rl''], ARRAY[10])'),
                  format('VALUES (%s::bigint, ''rl''::text, 0)', :via_claim),
                  'pepsi.claim claims the same way, without the line column');

SELECT pepsi.enqueue('rl', '{"n": 6}') AS late \gset
SELECT is((SELECT count(*)::int FROM pepsi.claim_lines(7, ARRAY['rl'], ARRAY[0], false, NULL,
                                                        ARRAY[4096])), 0,
          'a cap of 0 claims nothing');

SELECT throws_ok($$SELECT * FROM pepsi.claim_lines(7, ARRAY['rl'], ARRAY[1], false, NULL,
                                                   ARRAY[1, 2])$$,
                 '22023', NULL, 'line_limits must be aligned with stages');
SELECT throws_ok($$SELECT * FROM pepsi.claim_lines(NULL, ARRAY['rl'], ARRAY[1])$$,
                 '22004', NULL, 'a NULL dispatcher_id is refused, as by pepsi.claim');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :late), 'pending',
          'what was not claimed stays pending');

SELECT * FROM finish();
ROLLBACK;
