-- pause_stage (migration 0028): operators pause and resume a stage through the
-- overlay, as the dashboard does, without reading or writing pepsi.config
-- themselves; a stage and a producer cannot.  Against 0027 every test fails
-- (there was no function an operator could call).
BEGIN;
SELECT plan(8);

SELECT pepsi.register_stages(1, ARRAY['s'], NULL, NULL, NULL, NULL, NULL, NULL);

SET LOCAL ROLE pepsi_operator;
SELECT is(pepsi.pause_stage('s', true), true, 'an operator pauses a stage');
SELECT is(pepsi.pause_stage('s', true), false, 'pausing it again changes nothing');
SELECT throws_ok('SELECT * FROM pepsi.config', '42501', NULL,
                 'the operator still cannot read the overlay');
SELECT is(pepsi.pause_stage('s', false), true, 'an operator resumes it');
SELECT is(pepsi.pause_stage('s', false), false,
          'resuming a stage that is not paused changes no row (it only ends a hold-off)');
RESET ROLE;
SELECT is((SELECT count(*) FROM pepsi.config), 0::bigint, 'no overlay row is left');

SET LOCAL ROLE pepsi_stage;
SELECT throws_ok($$SELECT pepsi.pause_stage('s', true)$$, '42501', NULL,
                 'a stage program cannot pause a stage');
RESET ROLE;
SET LOCAL ROLE pepsi_ingress;
SELECT throws_ok($$SELECT pepsi.pause_stage('s', false)$$, '42501', NULL,
                 'a producer cannot resume one');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
