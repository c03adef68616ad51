"""The dispatcher's event loop: one process, one thread, one selector.

The selector watches the LISTEN connection's socket, every worker's pipes
and the signal self-pipe; its timeout is the earliest deadline, and 0 exactly
when database work is planned. Each wake: events (answers, notifications,
signals), reaping, timers (reconnect, heartbeat, watchdogs), reload, then
the database round trip (coordinator/database/round_trip.py), whose facts the
loop routes to the workers' side (claimed ids placed, failed claims held off).
Periodic work is a list of duties (coordinator/duties.py): the select timeout
is their minimum. docs/INTERNALS.md shows the parts and their states.

The invariant everything protects: **an id is never in two workers at once**
(coordinator/ledger.py).
"""

from __future__ import annotations

import enum
import logging
import os
import resource
import selectors
import signal
import time
from collections.abc import Callable
from dataclasses import replace

from pepsi_dispatch.config import Config, ConfigError, DispatchConfig, apply_overlay, reread_config
from pepsi_dispatch.contract import INF
from pepsi_dispatch.coordinator import gauges
from pepsi_dispatch.coordinator.comeback import Comeback, ReplicasHold
from pepsi_dispatch.coordinator.database.fence import Fence
from pepsi_dispatch.coordinator.database.flip import PausedFlip
from pepsi_dispatch.coordinator.database.isolation import Isolation
from pepsi_dispatch.coordinator.database.link import DatabaseLink, LinkState
from pepsi_dispatch.coordinator.database.port import DELAYED, TRY_NOW, DispatchStore, StoreError
from pepsi_dispatch.coordinator.database.postgres import PostgresStore
from pepsi_dispatch.coordinator.database.round_trip import RoundTrip
from pepsi_dispatch.coordinator.database.settle import Settlement
from pepsi_dispatch.coordinator.database.stats_flush import StatsFlush
from pepsi_dispatch.coordinator.duties import Every, earliest
from pepsi_dispatch.coordinator.failwatch import FailureWatch
from pepsi_dispatch.coordinator.lease import lease_of
from pepsi_dispatch.coordinator.ledger import Ledger
from pepsi_dispatch.coordinator.privileges import check_access, config_files, log_files
from pepsi_dispatch.coordinator.schedules import Scheduler
from pepsi_dispatch.coordinator.sdnotify import SystemdWatchdog, notify
from pepsi_dispatch.coordinator.signals import SelfPipe
from pepsi_dispatch.coordinator.startup import open_database
from pepsi_dispatch.coordinator.stats import Stats
from pepsi_dispatch.coordinator.workers.sentinel import guard_process_tree
from pepsi_dispatch.coordinator.workers.supervisor import Supervisor
from pepsi_dispatch.errors import FatalError

log = logging.getLogger(__name__)

#: Retention and dead letters: rows per purge_done / keep_dead_letters call, calls per heartbeat.
PURGE_BATCH = 1000
PURGE_MAX_BATCHES = 20
LONGEST_WAIT = 86400.0  # epoll takes no wait over ~24.8 days


class ReloadCause(enum.Enum):
    """What asked for a reload."""

    #: a ``config_changed`` notification: workers are retired only if the
    #: configuration really changed.
    NOTIFIED = "notified"
    #: SIGHUP, the operator's explicit request: every worker is retired.
    SIGHUP = "sighup"


class Dispatcher:
    """The coordinator: state of one ``pepsi-dispatch serve`` run."""

    def __init__(
        self,
        config: Config,
        clock: Callable[[], float] = time.monotonic,
        db: DispatchStore | None = None,
    ) -> None:
        """``clock`` (monotonic seconds) and ``db`` (the database port; default: the
        PostgreSQL store) are injected: a test passes a fake clock and a fake store."""
        self.clock = clock
        self.config = config
        #: the configuration as read from the file, without the overlay: a
        #: reconnect re-applies only the overlay to it, never re-reading the file
        #: (as SERVICE_USER, maybe half edited).
        self.file_config = config
        self.dispatch_config = dispatch_config = config.dispatch
        self.db = db if db is not None else PostgresStore(config.dsn, dispatch_config.competing)
        self.sel = selectors.DefaultSelector()
        #: the connections' state machine: coordinator/database/link.py.
        self.link = DatabaseLink(self.db, self.sel)
        self.stats = Stats()
        self.dispatcher_id = 0
        #: the fencing token every write carries (set at registration).
        self.fence = Fence()
        #: who holds which id, the writes owed about ids (kept until the
        #: round trip carrying them succeeds), the claim floors: coordinator/ledger.py.
        self.ledger = Ledger(self.dispatch_config.competing)
        #: stages failing everything (ERROR once per STATS_INTERVAL); systemd's watchdog.
        self.failwatch = FailureWatch(self.dispatch_config.stats_interval, clock())
        self.systemd_watchdog = SystemdWatchdog()
        #: the workers' side: coordinator/workers/supervisor.py.
        self.supervisor = Supervisor(
            config,
            self.sel,
            self.stats,
            self.ledger,
            lambda: self.link.connected,
            self._answers_read,
            self.failwatch,
        )
        self._database_side(clock())
        self.reload_pending = False
        #: what asked for the pending reload (SIGHUP retires workers even if nothing changed).
        self.reload_cause = ReloadCause.NOTIFIED
        #: a reload only if the stage table differs (after a reconnect).
        self.reload_if_changed = False
        #: register_stages after a reload failed: try again on the heartbeat.
        self.stages_unregistered = False
        self.shutting_down = False
        self.shutdown_deadline = INF
        self.signals_seen = 0
        #: a fatal error that ends the run after a graceful shutdown (exit 1).
        self.fatal: str | None = None
        #: signal handlers only set flags; their wakeup fd wakes the selector.
        self.signals = SelfPipe()
        self.heartbeat_interval = _heartbeat_interval(self.dispatch_config)
        #: competing: the workers stop a margin before others may reset our rows
        self.lease = lease_of(dispatch_config, self.heartbeat_interval)
        self.heartbeat_duties = self._heartbeat_duties()
        self.early_gauges = gauges.EarlyGauges()
        self.scheduler = Scheduler(config.schedules, self.db, lambda: not self.shutting_down)

    def _database_side(self, now: float) -> None:
        """The database side's parts (coordinator/database/), sharing the fence."""
        self.flip = PausedFlip(self.ledger, self.stats)
        self.isolation = Isolation(self.db, self.link, self.fence, self.flip)
        self.round_trip = RoundTrip(
            self.dispatch_config,
            self.db,
            self.link,
            self.ledger,
            self.supervisor,
            self.stats,
            self.clock,
            self.fence,
            self.flip,
            self.isolation,
            self._no_claims,
        )
        self.stats_flush = StatsFlush(
            self.db,
            self.link,
            self.stats,
            self.isolation,
            self.dispatch_config.stats_interval,
            self.supervisor.busy,
            now,
            self._flush_gauges,
        )
        self.settlement = Settlement(self.db, self.fence, self.ledger, self.stats)
        self.comeback = Comeback(
            self.db, self.supervisor, self.ledger, self.round_trip.declared_dead, self.fence
        )
        self.replicas_hold = ReplicasHold(self.db, self.fence, self.dispatch_config.orphan_timeout)

    def _heartbeat_duties(self) -> list[Every]:
        """The duties of each heartbeat interval, in the order they run."""
        interval = self.heartbeat_interval
        competing = self.dispatch_config.competing
        retention = self.dispatch_config.retention

        def serving() -> bool:
            return not self.shutting_down

        return [
            Every("registration check", interval, self.check_registration, lambda: competing),
            Every("heartbeat", interval, self._beat),
            Every(
                "stage registration",
                interval,
                self._register_stages,
                lambda: self.stages_unregistered and serving(),
            ),
            Every("orphan reset", interval, self._reset_orphans, lambda: competing and serving()),
            Every("dead letters", interval, self._keep_dead_letters, serving),
            Every("purge", interval, self._purge, lambda: retention > 0 and serving()),
        ]

    # == start-up ================================================================
    def start(self) -> None:
        """Connect, lock, register, LISTEN, reset orphans; raises UsageError if refused."""
        # Privileges are dropped by now: what a reload or a log rotation will need
        # later must work for this user, or we refuse to start (exit 2).
        check_access(config_files(self.config), log_files())
        registered_at = self.clock()
        self.config, self.dispatcher_id = open_database(self.db, self.config)
        self.lease.renewed(registered_at)
        self.comeback.connected()
        self.replicas_hold.connected(self.clock())
        self.link.up(self.db.listen_pid())
        self.link.watch_listen(self._on_listen)
        self.supervisor.dispatcher_id = self.fence.id = self.dispatcher_id
        self.supervisor.build(self.config)
        self.scheduler.replace(self.config.schedules)  # with the overlay's schedules
        stages = ", ".join(
            f"{s.name}({s.parallelism}x{s.queue_limit})" for s in self.config.stages.values()
        )
        log.info(
            "pepsi-dispatch started: dispatcher %d, %s mode, pid %d, config %s, stages: %s",
            self.dispatcher_id,
            "competing" if self.dispatch_config.competing else "single",
            os.getpid(),
            self.config.path or "built-in defaults",
            stages or "(none)",
        )

    def _on_signal(self, signum: int, frame: object) -> None:
        # Between bytecodes of the main thread; only sets flags (the wakeup fd woke the selector).
        if signum == signal.SIGCHLD:
            self.supervisor.reap_all = True
        elif signum == signal.SIGHUP:
            self.reload_pending = True
            self.reload_cause = ReloadCause.SIGHUP
        else:
            self.signals_seen += 1

    # == the loop ================================================================
    def run(self) -> int:
        """Serve until SIGINT/SIGTERM; returns the exit code (raises FatalError)."""
        self.signals.install(self.sel, self._on_signal)
        self.supervisor.sentinel = guard_process_tree()  # subreaper; kills groups if we die
        try:
            if self.signals_seen:  # stopped before start-up: nothing to clean up
                log.info("stop signal before start-up: exiting")
                return 0
            self.start()
            notify(f"READY=1\nSTATUS=dispatcher {self.dispatcher_id}\nMAINPID={os.getpid()}")
            now = self.clock()
            for duty in self.heartbeat_duties:
                duty.start(now)
            self.flip.due_now(now)
            while True:
                now = self.clock()
                timeout = min(self.next_timeout(now), LONGEST_WAIT)
                events = self.sel.select(max(0.0, timeout))
                now = self.clock()
                for key, _mask in events:
                    key.data(now)  # the callback given when the fd was registered
                if self.signals_seen and not self.shutting_down:
                    self._begin_shutdown(now)
                elif self.signals_seen > 1 and self.shutdown_deadline > now:
                    log.warning("second stop signal: killing workers now")
                    self.shutdown_deadline = now
                self.supervisor.reap(now)
                self._timers(now)
                db_ready = self.link.ready(now)
                if self.reload_pending and not self.shutting_down and db_ready:
                    self.reload_pending = False
                    cause, self.reload_cause = self.reload_cause, ReloadCause.NOTIFIED
                    self._reload(now, self.reload_if_changed, cause)
                    self.reload_if_changed = False
                # (asked again: a step above may have lost the connection)
                if self.link.ready(now):
                    self._database_work(now)
                    self._early_gauges(now)
                if self.shutting_down and not self.supervisor.all():
                    return self._finish_shutdown()
        finally:
            self.signals.restore()
            self.db.close()
            self.supervisor.sentinel.close()

    def next_timeout(self, now: float) -> float:
        """Seconds until the earliest duty, watchdog or deadline (INF: none)."""
        link = self.link
        # Zero exactly when the round trip has work now (RoundTrip.due answers what
        # RoundTrip.plan would build; while the database is away these wait for the
        # reconnect; a reload never runs once stopping, so it must not spin the loop).
        if link.ready(now) and (
            (self.reload_pending and not self.shutting_down)
            or self.round_trip.due(now, self._no_claims())
        ):
            return 0.0
        if link.held(now):
            t = link.hold_until
        elif link.connected:
            # The heartbeat goes on while stopping: until we unregister, our
            # workers still run our rows (competing: no replica may take them).
            t = min(
                earliest(self.heartbeat_duties, now),
                self.round_trip.next_due(now),
                self.stats_flush.next_due(now),
                self.scheduler.next_due(now),
            )
        else:
            t = link.reconnect_at
        t = min(t, self.shutdown_deadline, self.systemd_watchdog.due(), self.early_gauges.due)
        t = min(t, self.lease.deadline())
        if link.ready(now):
            t = min(t, self.replicas_hold.next_due())
        t = min(t, self.supervisor.next_deadline(now))
        return t - now

    # == events ==================================================================
    def _answers_read(self) -> None:
        """Answers came in: a stage may have paused a row (pausing does not notify)."""
        self.flip.dirty = True

    def _on_listen(self, now: float) -> None:
        try:
            channels = self.db.notifications()
        except StoreError as exc:
            self.link.lost(now, exc)
            return
        for channel in channels:
            if channel == "config_changed":
                self.reload_pending = True
            elif channel.startswith(TRY_NOW):  # a stage resumed: "try now"
                self.supervisor.end_hold_offs("resumed", channel.removeprefix(TRY_NOW))
            else:
                # An insert that took a low id may commit after a claim passed it.
                self.ledger.rescan()
                if channel == DELAYED:  # a delayed message: learn when it is due
                    self.flip.dirty = True

    def _timers(self, now: float) -> None:
        """Watchdogs, the heartbeat's duties, stop deadlines, reconnects."""
        self.systemd_watchdog.tick(now)
        self.failwatch.check(now)
        if self.lease.due(now):
            self._lease_lapsed(now)
        if not self.link.connected and now >= self.link.reconnect_at:
            self._reconnect(now)
        self._run_duties(now)
        if self.replicas_hold.holding and self.link.ready(now):
            try:
                self.replicas_hold.check(now)
            except StoreError as exc:
                if self.db.work_dead() or self.db.listen_dead():
                    self.link.lost(now, exc)
                else:  # a refusal (a missing grant): keep holding, keep the heartbeat
                    self.replicas_hold.failed(now, exc)
        self.supervisor.fire_due(now)
        if self.shutting_down and now >= self.shutdown_deadline:
            self.supervisor.kill_all_now(now)

    def _run_duties(self, now: float) -> None:
        """The heartbeat's duties, then the schedules', when due and the database is ready."""
        for duty in (*self.heartbeat_duties, self.scheduler):
            if not self.link.ready(now):
                return
            if now >= duty.next_due(now):
                try:
                    duty.run(now)
                except StoreError as exc:
                    self.link.lost(now, exc)
                    return

    # == database ================================================================
    def _database_work(self, now: float) -> None:
        """This wake's round trip; route its facts to the workers' side (place
        claimed ids, hold off stages whose claim failed); flush statistics when due."""
        facts = self.round_trip.run(now)
        for stage in facts.claim_failed:
            self.supervisor.hold_off(stage, now, "its claim failed (see the ERROR line above)")
        if facts.claimed:
            self.supervisor.place(facts.claimed, now, self.clock, facts.lines)
        if self.link.ready(now):  # the round trip may have lost the connection
            self.stats_flush.run(now)

    def _gauges(self, now: float) -> dict[str, object]:
        return gauges.collect(
            self.supervisor.pools,
            self.supervisor.leftover,
            self.ledger.holding(),
            self.round_trip.count,
            self.stats,
            self.heartbeat_interval,
            now,
        )

    def _flush_gauges(self, now: float) -> tuple[int, dict[str, object]] | None:
        """The gauges a statistics flush writes with it (none while stopping or
        before registration: the heartbeat alone says we are alive then)."""
        if self.shutting_down or self.dispatcher_id is None:
            return None
        return self.dispatcher_id, self._gauges(now)

    def _gauge_signature(self) -> tuple[object, ...]:
        """What, when it changes, goes out early: workers and health, and the
        unflushed statistics (so rates follow within about a second)."""
        sig = gauges.signature(self.supervisor.pools, self.supervisor.leftover)
        return (*sig, self.stats.unflushed_key())

    def _early_gauges(self, now: float) -> None:
        """Changed workers or stage health go out before the heartbeat (gauges.EarlyGauges)."""
        sig = self._gauge_signature()
        if (
            self.shutting_down
            or not self.link.ready(now)  # lost by this wake's round trip
            or not self.early_gauges.should_send(now, sig)
        ):
            return
        try:
            self.db.heartbeat(self.dispatcher_id, self._gauges(now))
        except StoreError as exc:
            self.link.lost(now, exc)
            return
        self.lease.renewed(now)
        self.early_gauges.sent_now(now, sig)

    def _beat(self, now: float) -> None:
        """The heartbeat: say we are alive, with the gauges; renew LISTEN. While
        stopping only say we are alive: in competing mode a replica whose heartbeat
        is older than ORPHAN_TIMEOUT has its rows reset by the others -- while its
        workers may still be finishing them within SHUTDOWN_TIMEOUT."""
        if self.shutting_down:
            self.db.heartbeat(self.dispatcher_id)
            self.lease.renewed(now)
            return
        # Rows made pending without a notification (an operator's requeue_failed)
        # are claimed at the latest on this tick (when busy, within about a second:
        # a claim in the same round trip as requeue_due goes unbounded).
        self.ledger.forget_floors()
        self.db.heartbeat(self.dispatcher_id, self._gauges(now))
        self.lease.renewed(now)
        if self.lease.strays_owed:  # back after a lapse without a reconnect
            self.settlement.release_strays()
            self.lease.strays_owed = False
        self.early_gauges.sent_now(now, self._gauge_signature())
        self.db.ping_listen()
        self._on_listen(now)  # notifications that arrived during the ping
        self.flip.due_now(now)
        self.ledger.want_claim()

    def _no_claims(self) -> bool:
        """Stopping, the lease lapsed, or waiting for the other replicas after
        connecting: no claims (nor flips) in the round trip."""
        return self.shutting_down or self.lease.lapsed or self.replicas_hold.holding

    def _lease_lapsed(self, now: float) -> None:
        """Competing: no heartbeat went through for nearly ORPHAN_TIMEOUT. Stop
        every worker before another replica may reset our rows and run them;
        release nothing (coordinator/lease.py)."""
        self.lease.lapsed = self.lease.strays_owed = True
        n_workers = len(self.supervisor.all())
        held = self.supervisor.drop_all()
        self.ledger.forget_holders()
        log.warning(
            "could not renew this replica's heartbeat for %.1f s (ORPHAN_TIMEOUT %g s, other"
            " replicas may reset our rows in %.1f s); stopped %d worker(s) holding %d"
            " message(s); no claims until a heartbeat goes through (what we still hold then"
            " goes back to pending)",
            now - self.lease.renewed_at,
            self.dispatch_config.orphan_timeout,
            self.lease.margin,
            n_workers,
            held,
        )

    def _reset_orphans(self, now: float) -> None:
        """Competing: rows of replicas dead longer than ORPHAN_TIMEOUT back to pending."""
        n = self.db.reset_orphans(self.dispatcher_id, self.dispatch_config.orphan_timeout)
        if n:
            log.info("reset %d orphaned running row(s) of dead replicas to pending", n)

    def _keep_dead_letters(self, now: float) -> None:
        """Kept failed rows leave the hot table (docs/INTERNALS.md, "Table sizes")."""
        moved = 0
        for _ in range(PURGE_MAX_BATCHES):
            n = self.db.keep_dead_letters(PURGE_BATCH)
            moved += n
            if n < PURGE_BATCH:
                break
        if moved:
            log.debug("moved %d kept failed row(s) to pepsi.dead_letters", moved)

    def _purge(self, now: float) -> None:
        """RETENTION: done rows older than it are deleted, in small batches."""
        purged = 0
        for _ in range(PURGE_MAX_BATCHES):
            n = self.db.purge_done(self.dispatch_config.retention, PURGE_BATCH)
            purged += n
            if n < PURGE_BATCH:
                break
        if purged:
            log.info("purged %d done row(s) older than RETENTION", purged)

    def _reconnect(self, now: float) -> None:
        """One reconnect attempt (coordinator/database/link.py), then what it means here."""
        done = self.link.reconnect(now, self._resume)
        if self.link.state is LinkState.LOCK_LOST:
            self._abort_fatal()
            return
        if done is None:
            return
        self.ledger.rescan()  # stray rows were released; notifications may be lost
        self.flip.due_now(now)
        self.scheduler.registered = False  # learn what other replicas settled meanwhile
        if done is LinkState.RECONNECT_WORK:
            return  # no notification was missed: the listen connection stayed
        # A config_changed may have been missed while disconnected: reload, but
        # retire workers only if the stage table really changed.
        self.reload_pending = True
        self.reload_if_changed = True

    def _resume(self, now: float) -> None:
        """Reconnected, the lock ours: are we still registered, and which rows
        do we hold that no worker has? Raises StoreError."""
        # Away longer than ORPHAN_TIMEOUT, we may have been declared dead.
        self.check_registration()
        self.comeback.check_server_restart()
        self.db.heartbeat(self.dispatcher_id)
        self.lease.renewed(now)
        # Even a work connection reopened alone may have found a restarted or
        # promoted server (its listen connection not yet seen dead).
        self.replicas_hold.connected(now)
        # Rows the database says we hold but no worker has (a claim that
        # committed while its answer was lost) go back to pending; rows
        # with an owed failure or answer check are left for those writes.
        self.settlement.release_strays()
        self.lease.strays_owed = False

    def check_registration(self, now: float = 0.0) -> None:
        """Competing: were we declared dead? (coordinator/comeback.py)"""
        self.comeback.check_registration()

    def _abort_fatal(self) -> None:
        """Another dispatcher owns the database: kill our workers and stop.

        Before going, the owed writes and the stats are still sent (best
        effort): the writes are fenced by dispatcher_id, so they change only
        rows still held by this dispatcher.
        """
        self.supervisor.abandon_all()
        self.settlement.settle_fenced()
        raise FatalError(self.link.lock_lost or self.fatal or "fatal error")

    # == reload ==================================================================
    def _reload(
        self,
        now: float,
        only_if_changed: bool = False,
        cause: ReloadCause = ReloadCause.NOTIFIED,
    ) -> None:
        try:
            # The same file, not a new search (after the privilege drop HOME differs);
            # the overlay goes on top of the file as at start-up. After a reconnect
            # (only_if_changed) only the overlay is read again.
            base = self.file_config if only_if_changed else reread_config(self.config)
            new = apply_overlay(base, self.db.overlay())
        except ConfigError as exc:
            log.error("reloaded configuration does not parse: %s; shutting down", exc)
            self.fatal = f"reloaded configuration does not parse: {exc}"
            self._begin_shutdown(now)
            return
        except StoreError as exc:
            self.reload_pending = True
            self.reload_if_changed = only_if_changed
            if cause is ReloadCause.SIGHUP:
                self.reload_cause = cause
            self.link.lost(now, exc)
            return
        self.file_config = base
        if new.schedules != self.config.schedules:  # no reason to retire workers by itself
            self.scheduler.replace(new.schedules)
            self.config = replace(self.config, schedules=new.schedules, sections=new.sections)
        if only_if_changed and new.stages == self.config.stages:
            return
        # A reload is the operator's "try now" for every stage, whatever changed.
        self.supervisor.end_hold_offs(
            "SIGHUP" if cause is ReloadCause.SIGHUP else "configuration reloaded"
        )
        if (
            cause is ReloadCause.NOTIFIED
            and new.stages == self.config.stages
            and new.sections == self.config.sections
        ):
            # A notification for a change that changes nothing (an overlay row set
            # to the value it had, a touched file): the workers stay.
            log.info("configuration reloaded: nothing changed, workers kept")
            return
        # [pepsi-dispatch] options are read once; only the stage table changes.
        self.config = replace(new, dsn=self.config.dsn, dispatch=self.dispatch_config)
        self._register_stages(now)
        n = self.supervisor.retire_all(now)
        self.supervisor.build(self.config)
        self.ledger.rescan()
        log.info(
            "configuration reloaded: stages %s; retiring %d worker(s)",
            ", ".join(
                f"{s.name}({s.parallelism}x{s.queue_limit})" for s in self.config.stages.values()
            )
            or "(none)",
            n,
        )

    def _register_stages(self, now: float) -> None:
        """The stage table into pepsi.stages (ingress checks, RETRY_DELAY); retried
        on the heartbeat while it fails."""
        self.stages_unregistered = True
        try:
            self.db.register_stages(self.dispatcher_id, self.config.stages.values())
        except StoreError as exc:
            self.link.lost(now, exc)
            return
        self.stages_unregistered = False

    # == shutdown ================================================================
    def _begin_shutdown(self, now: float) -> None:
        if self.shutting_down:
            return
        self.shutting_down = True
        notify("STOPPING=1")
        self.shutdown_deadline = now + self.dispatch_config.shutdown_timeout
        log.info(
            "stopping: no more claims; SIGTERM to %d worker(s), SHUTDOWN_TIMEOUT %g s",
            len(self.supervisor.all()),
            self.dispatch_config.shutdown_timeout,
        )
        self.supervisor.terminate_all()

    def _finish_shutdown(self) -> int:
        """All workers are gone: settle owed writes, release held rows, flush, unregister."""
        self.flip.log_summary(self.clock())
        deadline = self.clock() + max(self.dispatch_config.shutdown_timeout, 1.0)
        while True:
            now = self.clock()
            if not self.link.wait_ready(now, deadline, self.clock, self._reconnect):
                if now < deadline:
                    continue
                log.error(
                    "stopped without %s: held rows stay running "
                    "until the next dispatcher resets them",
                    "a database connection"
                    if not self.link.connected
                    else "settling them (errors)",
                )
                return 1
            try:
                n = self.settlement.settle_at_exit()
            except StoreError as exc:
                self.link.lost(now, exc)
                continue
            break
        usage = resource.getrusage(resource.RUSAGE_SELF)
        log.info(
            "pepsi-dispatch stopped: dispatcher %d, %d message(s) handed out, %d stage run(s),"
            " %d database round trip(s), %.2f s CPU%s",
            self.dispatcher_id,
            self.stats.total_messages,
            self.stats.total_stage_runs,
            self.round_trip.count,
            usage.ru_utime + usage.ru_stime,
            f", {n} held row(s) released" if n else "",
        )
        if self.fatal:
            raise FatalError(self.fatal)
        return 0


def _heartbeat_interval(dispatch_config: DispatchConfig) -> float:
    """POLL_INTERVAL; competing, at most a third of ORPHAN_TIMEOUT; at least 50 ms."""
    interval = dispatch_config.poll_interval
    if dispatch_config.competing:
        interval = min(interval, dispatch_config.orphan_timeout / 3)
    return max(interval, 0.05)


def serve(config: Config) -> int:
    """Run the dispatcher until SIGINT/SIGTERM; returns the exit code. Raises
    UsageError (exit 2: the database is served by another dispatcher, a bad
    overlay at start-up) and FatalError (exit 1: e.g. a reload that does not parse)."""
    return Dispatcher(config).run()


__all__ = ["Dispatcher", "serve"]
