-- pepsi.hop (stage fusion) and pepsi.stage_config (overlay for stage programs).
BEGIN;
SELECT plan(12);

CREATE FUNCTION pg_temp.running(s text, d bigint) RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO pepsi.workqueue (stage, status, dispatcher_id, retries)
    VALUES (s, 'running', d, 2) RETURNING workqueue_id $$;
SELECT pg_temp.running('resize', 4) AS h \gset

SELECT is(pepsi.hop(:h, 'upload', 'store', 4), false, 'hop refuses a wrong from_stage');
SELECT is(pepsi.hop(:h, 'resize', 'upload', 5), false, 'hop refuses a wrong dispatcher');
SELECT throws_ok(format($$SELECT pepsi.hop(%s, 'resize', 'up load', 4)$$, :h), '22023', NULL,
                 'hop refuses a bad to_stage');
SELECT is(pepsi.hop(:h, 'resize', 'upload', 4), true, 'hop moves a running row to the next stage');
SELECT results_eq(format('SELECT stage, status, dispatcher_id, retries FROM pepsi.workqueue WHERE workqueue_id = %s', :h),
    $$VALUES ('upload'::text, 'running'::text, 4::bigint, 0)$$,
    'the row stays running under the same dispatcher, retries 0');
SELECT is_empty($$SELECT * FROM pepsi.claim(9, ARRAY['upload'], ARRAY[10])$$,
                'a hopped row cannot be claimed by anyone else');
SELECT is(pepsi.finish(:h, 'upload', 4), true, 'the pass ends with a transition from the fused stage');
SELECT is(pepsi.hop(:h, 'upload', 'x', 4), false, 'a done row cannot hop');

INSERT INTO pepsi.config VALUES ('stage-b', 'NEXT', 'c'), ('stage-a', 'PARALLELISM', '2'),
                                ('pepsi-dispatch', 'EXPIRY', '1 h'), ('Schedule-ov', 'EVERY', '1 h'),
                                ('pepsi-httpd', 'HELD_OFF_LIMIT', '1 m');
SELECT results_eq('SELECT * FROM pepsi.stage_config()',
    $$VALUES ('Schedule-ov'::text, 'EVERY'::text, '1 h'::text),
             ('stage-a', 'PARALLELISM', '2'), ('stage-b', 'NEXT', 'c')$$,
    'stage_config returns the [stage-*] and [schedule-*] overlay rows, sorted, and nothing else');
SET LOCAL ROLE pepsi_stage;
SELECT is((SELECT count(*)::int FROM pepsi.stage_config()), 3, 'a stage program can read the overlay');
SELECT throws_ok('SELECT * FROM pepsi.config', '42501', NULL, 'but not the config table itself');
RESET ROLE;
SET LOCAL ROLE pepsi_ingress;
SELECT throws_ok($$SELECT pepsi.hop(1, 'a', 'b')$$, '42501', NULL, 'ingress cannot hop');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
