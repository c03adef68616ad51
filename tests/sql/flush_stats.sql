-- pepsi.flush_stats: the dispatcher's deltas are added, never overwrite.
BEGIN;
SELECT plan(12);

SELECT lives_ok($$SELECT pepsi.flush_stats(ARRAY['a', 'b'], ARRAY[5, 1]::bigint[], ARRAY[1, 0]::bigint[],
                      ARRAY[0, 2]::bigint[], ARRAY[1, 0]::bigint[], ARRAY[2.5, 0.5], 7, 9, 3, 1)$$,
                'flush_stats takes all deltas in one call');
SELECT results_eq('SELECT stage, processed, failed, timeouts, crashes, processing_seconds FROM pepsi.stage_stats ORDER BY stage',
    $$VALUES ('a'::text, 5::bigint, 1::bigint, 0::bigint, 1::bigint, 2.5::float8),
             ('b', 1, 0, 2, 0, 0.5)$$,
    'a first flush creates a row per stage');
SELECT results_eq('SELECT stage_runs, messages, failed, timeouts, crashes, requeued, expired FROM pepsi.dispatch_stats',
    $$VALUES (7::bigint, 9::bigint, 1::bigint, 2::bigint, 1::bigint, 3::bigint, 1::bigint)$$,
    'global totals: the scalars, and failed/timeouts/crashes summed over stages');

SELECT pepsi.flush_stats(ARRAY['a', 'c', 'a'], ARRAY[10, 4, 1]::bigint[], ARRAY[0, 0, 1]::bigint[],
                         ARRAY[0, 0, 0]::bigint[], ARRAY[0, 0, 0]::bigint[], ARRAY[1, 1, 1], 15, 15, 0, 0);
SELECT results_eq('SELECT stage, processed, failed, processing_seconds FROM pepsi.stage_stats ORDER BY stage',
    $$VALUES ('a'::text, 16::bigint, 2::bigint, 4.5::float8), ('b', 1, 0, 0.5), ('c', 4, 0, 1)$$,
    'a second flush adds to the totals (a stage named twice is summed), new stages appear');
SELECT results_eq('SELECT stage_runs, messages, failed FROM pepsi.dispatch_stats',
    $$VALUES (22::bigint, 24::bigint, 2::bigint)$$, 'global totals add up too');

UPDATE pepsi.stage_stats SET updated_at = '2000-01-01';
UPDATE pepsi.dispatch_stats SET updated_at = '2000-01-01';
SELECT lives_ok($$SELECT pepsi.flush_stats(ARRAY[]::text[], ARRAY[]::bigint[], ARRAY[]::bigint[],
                      ARRAY[]::bigint[], ARRAY[]::bigint[], ARRAY[]::float8[], 0, 0, 0, 0)$$,
                'empty arrays and zero scalars are accepted');
SELECT lives_ok($$SELECT pepsi.flush_stats(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)$$,
                'all-NULL arguments are accepted');
SELECT lives_ok($$SELECT pepsi.flush_stats(ARRAY['b'], ARRAY[0]::bigint[], ARRAY[0]::bigint[],
                      ARRAY[0]::bigint[], ARRAY[0]::bigint[], ARRAY[0]::float8[], 0, 0, 0, 0)$$,
                'an all-zero stage delta is accepted');
SELECT is((SELECT count(*)::int FROM pepsi.stage_stats WHERE updated_at <> '2000-01-01'), 0,
          'zero deltas write no stage row');
SELECT is((SELECT updated_at FROM pepsi.dispatch_stats), '2000-01-01'::timestamptz,
          'zero deltas do not write the global row');
SELECT results_eq('SELECT stage, processed FROM pepsi.stage_stats ORDER BY stage',
    $$VALUES ('a'::text, 16::bigint), ('b', 1), ('c', 4)$$, 'and nothing was lost or overwritten');
SELECT throws_ok($$SELECT pepsi.flush_stats(ARRAY['a', 'b'], ARRAY[1]::bigint[], NULL, NULL, NULL, NULL, 0, 0, 0, 0)$$,
                 '22023', NULL, 'per-stage arrays of different lengths are refused');

SELECT * FROM finish();
ROLLBACK;
