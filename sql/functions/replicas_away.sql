-- pepsi.replicas_away(dispatcher_id bigint, orphan_timeout interval)
--     → table(replica_id bigint, hostname text, pid int)
--   Competing mode: the registered replicas, other than dispatcher_id, that
--   may still have workers running rows whose claims the server lost, in id
--   order, with the host and process each registered from.  A replica's
--   claim commits without waiting for its WAL flush, so a server crash (or a
--   failover to a standby) can lose it and make its rows pending again while
--   a worker still runs them.  Such a replica last heartbeated before the
--   server (re)started -- greatest of the postmaster's start, the last crash
--   recovery (the reset of pg_stat_bgwriter) and the commit time of the last
--   transaction recovery replayed -- has no session now
--   (pepsi._dispatcher_live), and its heartbeat is younger than
--   orphan_timeout.  A replica therefore claims nothing after it connects
--   until every one listed has come back (its next heartbeat runs only after
--   it stopped every worker it had when the server restarted) or is older
--   than orphan_timeout (its lease has stopped its workers, and reset_orphans
--   takes its rows); the host and pid let an operator tell one gone for good
--   (pepsi.unregister_dispatcher ends the wait).  A replica killed while the
--   server kept running is not listed.
--   NULL dispatcher_id: every such replica.
--   Reads: pepsi.dispatchers, pg_locks, pg_stat_bgwriter.  Writes: nothing.
--   Locks: none.
--   Callers: pepsi_dispatcher (SECURITY DEFINER).
CREATE OR REPLACE FUNCTION pepsi.replicas_away(dispatcher_id bigint, orphan_timeout interval)
RETURNS TABLE (replica_id bigint, hostname text, pid integer)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
    SELECT d.dispatcher_id, d.hostname, d.pid
      FROM pepsi.dispatchers AS d
     WHERE d.dispatcher_id IS DISTINCT FROM replicas_away.dispatcher_id
       AND d.heartbeat_at >= now() - coalesce(replicas_away.orphan_timeout, interval '0')
       AND d.heartbeat_at <= greatest(pg_postmaster_start_time(),
                                      (SELECT b.stats_reset FROM pg_stat_bgwriter AS b),
                                      pg_last_xact_replay_timestamp())
       AND NOT pepsi._dispatcher_live(d.dispatcher_id)
     ORDER BY d.dispatcher_id
$$;
