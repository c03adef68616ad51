-- Undo small_tables_vacuum.v1.sql (migration 0038's downgrade): the server's
-- autovacuum thresholds again.
ALTER TABLE pepsi.dispatchers RESET (autovacuum_vacuum_threshold, autovacuum_vacuum_scale_factor);
ALTER TABLE pepsi.stage_stats RESET (autovacuum_vacuum_threshold, autovacuum_vacuum_scale_factor);
ALTER TABLE pepsi.dispatch_stats RESET (autovacuum_vacuum_threshold, autovacuum_vacuum_scale_factor);
ALTER TABLE pepsi.schedule_ticks RESET (autovacuum_vacuum_threshold, autovacuum_vacuum_scale_factor);
ALTER TABLE pepsi.stages RESET (autovacuum_vacuum_threshold, autovacuum_vacuum_scale_factor);
