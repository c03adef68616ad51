-- pepsi.purge_done: done rows older than the retention go, in small batches.
BEGIN;
SELECT plan(10);

INSERT INTO pepsi.workqueue (stage, status, updated_at)
SELECT 'p', 'done', now() - interval '8 days' - i * interval '1 s' FROM generate_series(1, 25) AS i;
INSERT INTO pepsi.workqueue (stage, status, updated_at) VALUES
    ('p', 'done', now() - interval '6 days'),
    ('p', 'failed', now() - interval '30 days'), ('p', 'timeout', now() - interval '30 days'),
    ('p', 'expired', now() - interval '30 days'), ('p', 'pending', now() - interval '30 days');

SELECT is(pepsi.purge_done(interval '7 days', 10), 10, 'one call deletes at most batch_size rows');
SELECT is((SELECT min(updated_at) > now() - interval '8 days' - interval '16 s'
             FROM pepsi.workqueue WHERE status = 'done'), true, 'the oldest rows go first');
SELECT is(pepsi.purge_done(interval '7 days', 10), 10, 'the next batch');
SELECT is(pepsi.purge_done(interval '7 days'), 5, 'the default batch takes the rest');
SELECT is(pepsi.purge_done(interval '7 days'), 0, 'then nothing is left to purge');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue WHERE status = 'done'), 1,
          'a done row younger than the retention stays');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue WHERE status <> 'done'), 4,
          'failed, timeout, expired and pending rows are never purged');
SELECT is(pepsi.purge_done(interval '0'), 0, 'retention 0 keeps everything');
SELECT is(pepsi.purge_done(NULL), 0, 'retention NULL keeps everything');
SELECT is(pepsi.purge_done(interval '1 day', 0), 0, 'batch size 0 deletes nothing');

SELECT * FROM finish();
ROLLBACK;
