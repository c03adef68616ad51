-- pause_stage (dashboard_pause_stage v2 before migration 0028): only a stage
-- the dispatcher serves (the stage registry) can be paused, so no dashboard
-- login, button or operator can write a PAUSED row for a stage the
-- configuration does not define -- a section without a PROGRAM, which made
-- the graph stop parsing and the dispatcher exit.
-- Against dashboard_pause_stage v1 the first two tests fail.
BEGIN;
SELECT plan(7);

SELECT pepsi.register_stages(1, ARRAY['fetch', 'store'], ARRAY['store', ''], NULL, NULL, NULL,
                             NULL, NULL);

SELECT throws_ok($$SELECT pepsi.pause_stage('ghost', true)$$, '22023', NULL,
                 'the dashboard cannot pause a stage the dispatcher does not serve');
SELECT is((SELECT count(*) FROM pepsi.config WHERE section = 'stage-ghost'), 0::bigint,
          'so no overlay row for an unknown stage is written');
SELECT throws_ok($$SELECT pepsi.pause_stage('bad name', true)$$, '22023', NULL,
                 'an invalid stage name is still refused');

SELECT is(pepsi.pause_stage('fetch', true), true, 'a registered stage is paused');
SELECT is((SELECT value FROM pepsi.config WHERE section = 'stage-fetch' AND option = 'PAUSED'), 'yes',
          'through the overlay');
SELECT is(pepsi.pause_stage('fetch', false), true, 'and resumed');

-- A leftover row of a stage that was dropped (written by hand, any case) can
-- still be removed by resuming it.
INSERT INTO pepsi.config (section, option, value) VALUES ('Stage-Gone', 'paused', 'yes');
SELECT is(pepsi.pause_stage('gone', false), true,
          'resuming removes a leftover PAUSED row of a stage the dispatcher dropped');

SELECT * FROM finish();
ROLLBACK;
