-- Liveness by session (register_dispatcher v2, heartbeat v4, _dispatcher_live,
-- queue_dispatchers v3, queue_overview v3, dashboard_snapshot v4, reset_orphans
-- v2).  A dispatcher killed with SIGKILL leaves its registration with a fresh
-- heartbeat and its last gauges; its sessions, and the liveness lock they
-- held, are gone.  Such a row is simulated by an INSERT (no session ever held
-- its lock).  Against 0016's functions tests 2, 3, 4 and 8 fail (live by
-- heartbeat age; the registration stayed until ORPHAN_TIMEOUT).
BEGIN;
SELECT plan(10);

SELECT pepsi.register_dispatcher('here', 1, false) AS live_id \gset
SELECT pepsi.heartbeat(:live_id, '{"heartbeat_interval": 30, "workers": {"s": {"busy": 1}}}');
INSERT INTO pepsi.dispatchers (hostname, pid, competing, heartbeat_at, gauges)
VALUES ('killed', 2, false, now(),
        '{"heartbeat_interval": 30, "inflight": 9, "workers": {"s": {"busy": 4}}}')
RETURNING dispatcher_id AS dead_id \gset

SELECT is((SELECT live FROM pepsi.queue_dispatchers() WHERE dispatcher_id = :live_id), true,
          'a dispatcher whose session is there is live');
SELECT is((SELECT live FROM pepsi.queue_dispatchers() WHERE dispatcher_id = :dead_id), false,
          'a dispatcher killed with SIGKILL is not live, however fresh its heartbeat');
SELECT results_eq($$SELECT dispatchers, workers_busy FROM pepsi.queue_overview() WHERE stage = 's'$$,
    $$VALUES (1::bigint, 1::bigint)$$,
    'queue_overview counts neither a killed dispatcher nor its phantom busy workers');
SELECT is((SELECT array_agg((e ->> 'dispatcher_id')::bigint)
             FROM jsonb_array_elements(pepsi.dashboard_snapshot() -> 'dispatchers') AS e),
          ARRAY[:live_id]::bigint[],
          'the dashboard snapshot (so /metrics) never exports a killed dispatcher');

-- A lost connection: the lock goes with the session; the next heartbeat, on
-- the new connection, takes it again.
SELECT pg_advisory_unlock(1885629558, (:live_id & 2147483647)::int);
SELECT is((SELECT live FROM pepsi.queue_dispatchers() WHERE dispatcher_id = :live_id), false,
          'without its session a dispatcher is not live');
SELECT pepsi.heartbeat(:live_id);
SELECT is((SELECT live FROM pepsi.queue_dispatchers() WHERE dispatcher_id = :live_id), true,
          'its next heartbeat makes it live again');
SELECT pepsi.heartbeat(:live_id);
SELECT is((SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
              AND classid = 1885629558::oid AND objid = (:live_id & 2147483647)::oid),
          1::bigint, 'heartbeats do not stack the lock');

-- A single dispatcher starting (it holds the database lock exclusively) removes
-- every other registration, fresh heartbeat or not.
SELECT pepsi.register_dispatcher('new', 3, false) AS new_id \gset
SELECT pepsi.reset_orphans(:new_id, false, interval '300 s');
SELECT is((SELECT array_agg(dispatcher_id ORDER BY dispatcher_id) FROM pepsi.dispatchers),
          ARRAY[:new_id]::bigint[],
          'a new single dispatcher removes the registration of one killed a moment ago');

-- Competing replicas keep ORPHAN_TIMEOUT for removal (a replica re-establishing
-- its connection may still have workers running) ...
INSERT INTO pepsi.dispatchers (hostname, pid, competing, heartbeat_at)
VALUES ('reconnecting', 4, true, now()) RETURNING dispatcher_id AS rec_id \gset
SELECT pepsi.reset_orphans(:new_id, true, interval '300 s');
SELECT ok(EXISTS (SELECT 1 FROM pepsi.dispatchers WHERE dispatcher_id = :rec_id),
          'competing: a registration with a fresh heartbeat stays until ORPHAN_TIMEOUT');
-- ... but it is not counted meanwhile.
SELECT is((SELECT count(*) FROM pepsi.queue_dispatchers() WHERE live), 1::bigint,
          'competing: only replicas with a session count as live');

SELECT * FROM finish();
ROLLBACK;
