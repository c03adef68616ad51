-- The small tables rewritten in place are vacuumed every autovacuum round in
-- which they have a dead row (migration 0038).
--
-- pepsi.dispatchers (a row per dispatcher, rewritten by each heartbeat, up
-- to once a second with its gauges), pepsi.stage_stats and
-- pepsi.dispatch_stats (a row per stage or dispatcher and stage, rewritten
-- by each statistics flush), pepsi.schedule_ticks (a row per schedule,
-- rewritten by each tick) and pepsi.stages (a row per stage) hold as many
-- rows as the configuration has, and every write is an UPDATE.  Nearly every
-- update is HOT, and page pruning removes the old versions, so the dead-row
-- count that starts an autovacuum (50 by default) is reached only after
-- hours or never.  But while some transaction's snapshot still protects the
-- old versions (any open transaction of any role) a page fills, the next
-- update goes to another page, and only VACUUM records that the old page
-- emptied meanwhile: without it every such update extends the file (a
-- 60-minute endurance run saw pepsi.dispatchers grow 8 -> 312 kB).  With a
-- threshold of 0 autovacuum visits such a table once a naptime (1 minute)
-- when it has any dead row: a few pages each time, and the file stays at
-- the pages its rows and one naptime of updates need.
ALTER TABLE pepsi.dispatchers SET (autovacuum_vacuum_threshold = 0, autovacuum_vacuum_scale_factor = 0);
ALTER TABLE pepsi.stage_stats SET (autovacuum_vacuum_threshold = 0, autovacuum_vacuum_scale_factor = 0);
ALTER TABLE pepsi.dispatch_stats SET (autovacuum_vacuum_threshold = 0, autovacuum_vacuum_scale_factor = 0);
ALTER TABLE pepsi.schedule_ticks SET (autovacuum_vacuum_threshold = 0, autovacuum_vacuum_scale_factor = 0);
ALTER TABLE pepsi.stages SET (autovacuum_vacuum_threshold = 0, autovacuum_vacuum_scale_factor = 0);
