-- dashboard_snapshot v4: the dashboard role sees only the overlay options the
-- dashboard shows, never a DSN or a password.  Against v3 the first three tests
-- fail (the overlay went out as it is, WORKER_DSN and its password included).
BEGIN;
SELECT plan(7);

INSERT INTO pepsi.config (section, option, value) VALUES
    ('stage-fetch', 'WORKER_DSN', 'host=db user=stage password=hunter2'),
    ('stage-fetch', 'worker_dsn', 'postgresql://stage:hunter3@db/pepsi'),
    ('pepsi-dispatch', 'WORKER_DSN', 'host=db password=hunter4'),
    ('database', 'DSN', 'host=db password=hunter5'),
    ('stage-fetch', 'PROGRAM', '/usr/bin/fetch --password hunter6'),
    ('stage-store', 'PROGRAM', '/usr/bin/store'),
    ('stage-fetch', 'PAUSED', 'yes'),
    ('stage-fetch', 'NEXT', 'store'),
    ('stage-fetch', 'PARALLELISM', '3'),
    ('stage-store', 'QUEUE_LIMIT', '2');

CREATE TEMP TABLE snap AS SELECT pepsi.dashboard_snapshot() AS s;

SELECT ok((SELECT s::text NOT LIKE '%hunter%' FROM snap),
          'the dashboard snapshot carries no password (WORKER_DSN, DSN, a PROGRAM with one)');
SELECT ok(NOT EXISTS (SELECT 1 FROM snap, jsonb_array_elements(s -> 'overlay') AS o
                       WHERE o ->> 1 ILIKE '%dsn%'),
          'no DSN option of any section reaches the dashboard');
SELECT ok(NOT EXISTS (SELECT 1 FROM snap, jsonb_array_elements(s -> 'overlay') AS o
                       WHERE o ->> 0 NOT ILIKE 'stage-%'),
          'only [stage-*] sections reach the dashboard');
SELECT results_eq($$SELECT o ->> 0, o ->> 1, o ->> 2
                      FROM snap, jsonb_array_elements(s -> 'overlay') AS o ORDER BY 1, 2$$,
    $$VALUES ('stage-fetch'::text, 'NEXT'::text, 'store'::text), ('stage-fetch', 'PARALLELISM', '3'),
             ('stage-fetch', 'PAUSED', 'yes'), ('stage-store', 'PROGRAM', '/usr/bin/store'),
             ('stage-store', 'QUEUE_LIMIT', '2')$$,
    'the options the dashboard shows still reach it');

-- The other dashboard functions read messages, never the configuration.
SELECT pepsi.enqueue('fetch', '{"n": 1}') AS m \gset
SELECT ok(pepsi.dashboard_message(:m)::text NOT LIKE '%hunter%', 'dashboard_message shows no credential');
SELECT ok(NOT EXISTS (SELECT 1 FROM pepsi.dashboard_failed(NULL, NULL, 100) AS f
                       WHERE f::text LIKE '%hunter%'), 'dashboard_failed shows no credential');
SELECT ok(NOT has_table_privilege('pepsi_dashboard', 'pepsi.config', 'SELECT'),
          'pepsi_dashboard cannot read pepsi.config itself');

SELECT * FROM finish();
ROLLBACK;
