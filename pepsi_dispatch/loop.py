"""The dispatcher's event loop (SPEC §6): one process, one thread, one selector.

The selector watches the LISTEN connection's socket, every worker's stdout and
stderr (and stdin while a write is pending), and a self-pipe that signal
handlers write to (``signal.set_wakeup_fd``). Its timeout is the earliest
timer: the POLL_INTERVAL heartbeat, the next paused row's due time, idle
reaps, spawn cooldowns, MAX_RUNTIME deadlines, the stats flush, reconnects.

Every iteration first drains all events (answers, notifications, exits), then
does the database work of the iteration in one pipeline
(:meth:`pepsi_dispatch.db.Database.iteration`: record failures, check ``0``
answers, requeue due rows, ONE claim for every stage with room), then hands
the claimed ids to workers, one write per worker.

The invariant everything here protects: **an id is never in two workers at
once**. A worker's unanswered ids go back to pending only after the worker
is dead and reaped; a row handed to a worker stays on that worker's in-flight
list until it is answered or the worker is gone.
"""

from __future__ import annotations

import enum
import logging
import os
import resource
import selectors
import signal
import subprocess
import time
from dataclasses import replace
from typing import Any

import psycopg
from psycopg import errors as pgerrors

from . import gauges
from .backoff import Backoff
from .config import Config, ConfigError, apply_overlay, reread_config
from .db import CONNECTION_LOST, DELAYED, Database, IterationResult, Requeue, ids_text
from .errors import FatalError, UsageError
from .ledger import Ledger
from .pool import StagePool, worker_env
from .privileges import check_access, config_files, log_files
from .process import (
    EX_TEMPFAIL,
    ExitKind,
    Worker,
    become_subreaper,
    classify_exit,
    describe_exit,
    reap_orphans,
)
from .protocol import FAILED, OK, PROTOCOL_ERROR, Answer, parse_answer
from .stats import Stats

log = logging.getLogger(__name__)

#: requeue_due runs at most this often because of answers (a stage may have
#: paused a row; pausing does not notify). A pause of 2 s is thus retried on
#: time: its due time is learned within a second of the pause.
REQUEUE_AFTER_ANSWERS = 1.0
#: After requeue_due itself failed (a poisoned paused row): next try after this.
REQUEUE_RETRY_AFTER_ERROR = 10.0
#: Requeue summaries at INFO at most this often.
REQUEUE_LOG_EVERY = 60.0
#: Flush stats on going idle at most this often.
IDLE_FLUSH_MIN = 1.0
#: A worker whose stdout reached EOF but which has not exited is SIGKILLed after this.
EOF_GRACE = 2.0
#: A worker must read its first input within max(MAX_RUNTIME, this) of being
#: given it, else it is killed as hung in start-up. Never less than 30 s: a
#: tight MAX_RUNTIME must not kill every worker of a slow-starting stage.
STARTUP_MIN = 30.0
#: Reconnect backoff (seconds): first, cap.
RECONNECT_FIRST = 0.1
RECONNECT_MAX = 5.0
#: After a reconnect finds the lock still held by our OLD listen session (its
#: server backend outlived a network partition longer than the keepalives):
#: how long to wait for that backend to go (it is terminated) before deciding
#: that another dispatcher took the lock; and the retry pause meanwhile.
LOCK_RETAKE_WINDOW = 5.0
LOCK_RETAKE_RETRY = 0.2
#: Retention: done rows deleted per purge_done call and calls per heartbeat.
PURGE_BATCH = 1000
PURGE_MAX_BATCHES = 20
INF = float("inf")


class ReloadCause(enum.Enum):
    """What asked for a reload."""

    #: a ``config_changed`` notification: workers are retired only if the
    #: configuration really changed.
    NOTIFIED = "notified"
    #: SIGHUP, the operator's explicit request: every worker is retired.
    SIGHUP = "sighup"


class Dispatcher:
    """The coordinator: state of one ``pepsi-dispatch serve`` run."""

    def __init__(self, config: Config) -> None:
        self.config = config
        #: the configuration as read from the file, without the overlay: a
        #: reconnect re-applies only the overlay to it, never re-reading the file
        #: (as SERVICE_USER, maybe half edited).
        self.file_config = config
        self.dc = config.dispatch
        self.db = Database(config.dsn, self.dc.competing)
        self.stats = Stats()
        self.sel = selectors.DefaultSelector()
        self.dispatcher_id = 0
        self.generation = 0
        self.pools: dict[str, StagePool] = {}
        #: pools of stages a reload removed, kept until their workers are gone.
        self.leftover: list[StagePool] = []
        #: who holds which id, the writes owed about ids (kept until the
        #: pipeline carrying them succeeds), the claim floors: pepsi_dispatch/ledger.py.
        self.ledger = Ledger(self.dc.competing)
        # Flags and timers (monotonic seconds).
        self.requeue_dirty = False
        self._requeue_sums = [0, 0, 0]
        self._requeue_logged = -INF
        self.requeue_at = 0.0
        self.last_requeue = -INF
        #: requeue_due itself failed (a poisoned paused row): not again before this.
        self.requeue_blocked_until = 0.0
        self.next_heartbeat = 0.0
        self.last_flush = time.monotonic()
        self.db_ok = False
        self.reconnect_at = INF
        #: delay before the next reconnect attempt.
        self.reconnect_backoff = Backoff(RECONNECT_FIRST, RECONNECT_MAX)
        self.reconnect_failures = 0
        self.last_down_log = -INF
        #: reconnect only the work connection (the listen one and its lock are fine).
        self.reconnect_work_only = False
        #: backend pid of our listen connection (holder of the lock) and, while
        #: retaking the lock from it after a reconnect, the deadline (0 = none).
        self.listen_pid = 0
        self.lock_retake_deadline = 0.0
        #: after a query error on healthy connections: no database work before this,
        #: and the backoff of the next such wait.
        self.db_hold_until = 0.0
        self.db_hold = Backoff(RECONNECT_FIRST, RECONNECT_MAX)
        self.last_query_error_log = -INF
        self.reload_pending = False
        #: what asked for the pending reload (SIGHUP retires workers even if nothing changed).
        self.reload_cause = ReloadCause.NOTIFIED
        #: a reload only if the stage table differs (after a reconnect).
        self.reload_if_changed = False
        #: register_stages after a reload failed: try again on the heartbeat.
        self.stages_unregistered = False
        self._listen_fd = -1
        self.sigchld = False
        self.shutting_down = False
        self.shutdown_deadline = INF
        self.signals_seen = 0
        #: hot-path pipelines sent (for the stop line: messages per round trip).
        self.round_trips = 0
        #: a fatal error that ends the run after a graceful shutdown (exit 1).
        self.fatal: str | None = None
        #: the advisory lock went to another dispatcher while we reconnected:
        #: stop at once, without touching rows (see _abort_fatal).
        self.lock_lost: str | None = None
        self._sig_r = self._sig_w = -1
        self._old_handlers: dict[int, Any] = {}
        self.heartbeat_interval = self.dc.poll_interval
        if self.dc.competing:
            self.heartbeat_interval = min(self.heartbeat_interval, self.dc.orphan_timeout / 3)
        self.heartbeat_interval = max(self.heartbeat_interval, 0.05)

    # == start-up ================================================================
    def start(self) -> None:
        """Connect, lock, register, LISTEN, reset orphans; raises UsageError if refused."""
        # Privileges are dropped by now: what a reload or a log rotation will need
        # later must work for this user, or we refuse to start (exit 2).
        check_access(config_files(self.config), log_files())
        try:
            self.db.connect()
        except psycopg.Error as exc:
            raise FatalError(f"cannot connect to the database: {_one_line(exc)}") from None
        try:
            if not self.db.try_lock():
                holders = self.db.lock_holders()
                mode = "competing " if self.dc.competing else ""
                raise UsageError(
                    f"another dispatcher already serves this database ({holders}); "
                    f"this {mode}dispatcher refuses to start"
                    + (
                        " (a single dispatcher and competing replicas cannot be mixed)"
                        if self.dc.competing
                        else ""
                    )
                )
            # The overlay applies at start-up too; a bad one is a configuration error (exit 2).
            self.config = apply_overlay(self.config, self.db.overlay())
            self.dispatcher_id = self.db.register()
            # LISTEN before the first claim: nothing enqueued after this is missed.
            self.db.start_listening()
            n = self.db.reset_orphans(self.dispatcher_id, self.dc.orphan_timeout)
            self.db.register_stages(self.dispatcher_id, self.config.stages.values())
        except (pgerrors.UndefinedTable, pgerrors.UndefinedFunction, pgerrors.InvalidSchemaName):
            raise UsageError(
                f"database {self.db.dbname()!r} has no (current) pepsi schema:"
                " run 'alembic upgrade head' with PEPSI_DSN set to it"
            ) from None
        except psycopg.Error as exc:
            raise FatalError(f"database error during start-up: {_one_line(exc)}") from None
        if n:
            log.info("reset %d orphaned running row(s) to pending", n)
        if self.dc.competing and self.dc.shutdown_timeout >= self.dc.orphan_timeout:
            log.warning(
                "SHUTDOWN_TIMEOUT (%g s) >= ORPHAN_TIMEOUT (%g s): should this replica's"
                " heartbeat stall while it stops (database trouble), other replicas reset"
                " and run again rows its workers are still finishing; keep SHUTDOWN_TIMEOUT"
                " below ORPHAN_TIMEOUT",
                self.dc.shutdown_timeout,
                self.dc.orphan_timeout,
            )
        if self.dc.db_pool_size < 2:
            log.warning(
                "DB_POOL_SIZE = %d, but the dispatcher needs its 2 connections"
                " (LISTEN + work); using 2",
                self.dc.db_pool_size,
            )
        self.db_ok = True
        self.listen_pid = self.db.listen_pid()
        self._watch_listen()
        self._build_pools(self.config)
        stages = ", ".join(
            f"{s.name}({s.parallelism}x{s.queue_limit})" for s in self.config.stages.values()
        )
        log.info(
            "pepsi-dispatch started: dispatcher %d, %s mode, pid %d, config %s, stages: %s",
            self.dispatcher_id,
            "competing" if self.dc.competing else "single",
            os.getpid(),
            self.config.path or "built-in defaults",
            stages or "(none)",
        )

    def _build_pools(self, config: Config) -> None:
        self.generation += 1
        old = self.pools
        self.pools = {name: StagePool(sc, self.generation) for name, sc in config.stages.items()}
        for name, pool in old.items():
            if name in self.pools:
                self.pools[name].workers.extend(pool.workers)
                self.pools[name].cooldown_until = pool.cooldown_until
                self.pools[name].cooldown = pool.cooldown
            elif pool.workers:
                self.leftover.append(pool)
        # A stage removed by one reload and added again by the next: the workers
        # of its old pool (retiring) still run and count against PARALLELISM.
        for pool in list(self.leftover):
            if pool.name in self.pools:
                self.pools[pool.name].workers.extend(pool.workers)
                self.leftover.remove(pool)

    def _watch_listen(self) -> None:
        self._listen_fd = self.db.listen_fileno()
        self.sel.register(self._listen_fd, selectors.EVENT_READ, ("listen", None))

    def _install_signals(self) -> None:
        self._sig_r, self._sig_w = os.pipe()
        os.set_blocking(self._sig_r, False)
        os.set_blocking(self._sig_w, False)
        signal.set_wakeup_fd(self._sig_w, warn_on_full_buffer=False)
        self.sel.register(self._sig_r, selectors.EVENT_READ, ("signal", None))
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _restore_signals(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(-1)
        for fd in (self._sig_r, self._sig_w):
            if fd >= 0:
                os.close(fd)

    def _on_signal(self, signum: int, frame: object) -> None:
        # Runs between bytecodes of the main thread; only sets flags. The
        # wakeup fd already woke the selector.
        if signum == signal.SIGCHLD:
            self.sigchld = True
        elif signum == signal.SIGHUP:
            self.reload_pending = True
            self.reload_cause = ReloadCause.SIGHUP
        else:
            self.signals_seen += 1

    # == the loop ================================================================
    def run(self) -> int:
        """Serve until SIGINT/SIGTERM; returns the exit code (raises FatalError)."""
        self._install_signals()
        # Orphaned grandchildren of workers come to us, to be reaped (see _reap).
        if not become_subreaper():
            log.debug("cannot become a child subreaper; escaped grandchildren go to init")
        try:
            self.start()
            now = time.monotonic()
            self.next_heartbeat = now + self.heartbeat_interval
            self.requeue_at = now
            while True:
                now = time.monotonic()
                timeout = self._next_timeout(now)
                events = self.sel.select(None if timeout == INF else max(0.0, timeout))
                now = time.monotonic()
                for key, _mask in events:
                    kind, w = key.data
                    if kind in ("out", "err", "in"):
                        self._on_worker_event(kind, w, now)
                    elif kind == "listen":
                        self._on_listen(now)
                    else:
                        self._drain_signal_pipe()
                if self.signals_seen and not self.shutting_down:
                    self._begin_shutdown(now)
                elif self.signals_seen > 1 and self.shutdown_deadline > now:
                    log.warning("second stop signal: killing workers now")
                    self.shutdown_deadline = now
                self._reap(now)
                self._timers(now)
                db_ready = self.db_ok and now >= self.db_hold_until
                if self.reload_pending and not self.shutting_down and db_ready:
                    self.reload_pending = False
                    cause, self.reload_cause = self.reload_cause, ReloadCause.NOTIFIED
                    self._reload(now, self.reload_if_changed, cause)
                    self.reload_if_changed = False
                if db_ready:
                    self._db_iteration(now)
                if self.shutting_down and not self._all_workers():
                    return self._finish_shutdown()
        finally:
            self._restore_signals()
            self.db.close()

    def _all_workers(self) -> list[Worker]:
        out: list[Worker] = []
        for pool in self.pools.values():
            out.extend(pool.workers)
        for pool in self.leftover:
            out.extend(pool.workers)
        return out

    def _pool_of(self, w: Worker) -> StagePool | None:
        pool = self.pools.get(w.stage)
        if pool is not None and w in pool.workers:
            return pool
        for p in self.leftover:
            if w in p.workers:
                return p
        return None

    def _next_timeout(self, now: float) -> float:
        """Seconds until the earliest timer (INF: none)."""
        held = self.db_ok and now < self.db_hold_until
        db_ready = self.db_ok and not held
        if db_ready and (self.ledger.releases or (self.reload_pending and not self.shutting_down)):
            # (While the database is away these wait for the reconnect; a reload
            # never runs once stopping, so it must not spin the loop then.)
            return 0.0
        if db_ready and self.ledger.claim_needed and not self.shutting_down:
            if any(p.capacity(now) > 0 for p in self.pools.values()):
                return 0.0
        t = INF
        if held:
            t = min(t, self.db_hold_until)
        elif self.db_ok:
            # The heartbeat goes on while stopping: until we unregister, our
            # workers still run our rows (competing: no replica may take them).
            t = min(t, self.next_heartbeat)
            if not self.shutting_down:
                blocked = self.requeue_blocked_until
                t = min(t, self.next_heartbeat, max(self.requeue_at, blocked))
                if self.requeue_dirty:
                    t = min(t, max(self.last_requeue + REQUEUE_AFTER_ANSWERS, blocked))
            if self.stats.pending():
                t = min(t, self.last_flush + self.dc.stats_interval)
        else:
            t = min(t, self.reconnect_at)
        t = min(t, self.shutdown_deadline)
        idle_timeout = self.dc.worker_idle_timeout
        busy = False
        for pool in self.pools.values():
            if pool.cooldown_until and not self.shutting_down:
                t = min(t, pool.cooldown_until)
        for w in self._all_workers():
            if w.inflight:
                busy = True
                if w.killed:
                    pass
                elif not w.reading:
                    # Poll for its first read (see Worker.has_read) every 20 ms.
                    limit = max(self.dc.max_runtime, STARTUP_MIN)
                    t = min(t, now + 0.02, w.first_given + limit)
                else:
                    t = min(t, w.head_since + self.dc.max_runtime)
            elif not w.stopping:
                t = min(t, w.idle_since + idle_timeout)
            if w.killed:
                t = min(t, now + 0.01)  # reap soon
            elif w.eof:
                t = min(t, w.eof_at + EOF_GRACE)
            elif w.stopping and w.stop_deadline:
                t = min(t, w.stop_deadline)
        if not busy and db_ready and self.stats.pending():
            t = min(t, self.last_flush + IDLE_FLUSH_MIN)
        return t - now

    # == events ==================================================================
    def _drain_signal_pipe(self) -> None:
        try:
            while os.read(self._sig_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _on_listen(self, now: float) -> None:
        try:
            channels = self.db.notifications()
        except psycopg.Error as exc:
            self._db_lost(now, exc)
            return
        for channel in channels:
            if channel == "config_changed":
                self.reload_pending = True
            else:
                # An insert that took a low id may commit after a claim passed it.
                self.ledger.rescan()
                if channel == DELAYED:  # a delayed message: learn when it is due
                    self.requeue_dirty = True

    def _on_worker_event(self, kind: str, w: Worker, now: float) -> None:
        """One worker's pipe is ready. Whatever goes wrong handling it ends that
        worker (its ids are settled when it is reaped), never the dispatcher."""
        try:
            if kind == "out":
                self._on_stdout(w, now)
            elif kind == "err":
                self._on_stderr(w)
            elif w.flush_stdin():
                self._unwatch(w.stdin_fd)
        except Exception:  # noqa: BLE001 - one worker's output must not end the loop
            log.exception(
                "stage %s worker pid %d: unexpected error handling its %s; stopping it",
                w.stage,
                w.pid,
                {"out": "answers", "err": "stderr"}.get(kind, "stdin"),
            )
            if not w.killed:
                self._kill(w, now)

    def _on_stdout(self, w: Worker, now: float) -> None:
        lines = w.read_answers()
        if lines is None:
            self._unwatch(w.stdout_fd)
            w.eof = True
            w.eof_at = now
            if w.proc.stdout is not None:
                w.proc.stdout.close()
            w.stdout_fd = None
            self.sigchld = True  # look for its exit status now
            return
        if lines:
            self._answers(w, lines, now)

    def _answers(self, w: Worker, lines: list[bytes], now: float) -> None:
        """Process answer lines of ``w`` in order (SPEC §5)."""
        if w.killed:
            return  # its in-flight list is being torn down; answers no longer map to ids
        w.reading = True
        stats = self.stats
        pool = self._pool_of(w)
        debug = log.isEnabledFor(logging.DEBUG)
        inflight = w.inflight
        ledger = self.ledger
        for line in lines:
            if not inflight:
                log.warning(
                    "stage %s worker pid %d: answer %r with no message in flight "
                    "(protocol error); stopping it",
                    w.stage,
                    w.pid,
                    line[:200],
                )
                self._kill(w, now)
                break
            wid = inflight.popleft()
            # (Still in ``inflight``: the stage let go of the row -- advanced it to
            # itself, or paused it and it was requeued -- and it was claimed and
            # handed to this same worker again. That second copy is still ours.)
            ledger.let_go(wid, w, wid in inflight)
            seconds = now - w.head_since
            w.head_since = now
            w.answered += 1
            if line == b"0":  # the hot path
                ledger.answered(wid, w.stage)
                stats.succeeded(w.stage, seconds)
                if debug:
                    log.debug("stage %s pid %d: %d done (%.3f s)", w.stage, w.pid, wid, seconds)
                continue
            try:
                answer = parse_answer(line)
            except Exception as exc:  # noqa: BLE001 - a bug here must cost one worker only
                log.exception("stage %s worker pid %d: cannot classify an answer", w.stage, w.pid)
                answer = Answer(PROTOCOL_ERROR, f"unreadable answer ({type(exc).__name__})")
            if answer.kind == OK:
                fused = self._fused_allowed(w, answer.fused)
                ledger.answered(wid, fused[-1] if fused else w.stage)
                stats.succeeded(w.stage, seconds, fused)
                if debug:
                    log.debug("stage %s pid %d: %d %s", w.stage, w.pid, wid, answer.text)
            elif answer.kind == FAILED:
                ledger.failed(wid, "failed", answer.text)
                stats.failed(w.stage, seconds)
                if debug:
                    log.debug("stage %s pid %d: %d failed: %s", w.stage, w.pid, wid, answer.text)
            else:
                ledger.failed(wid, "failed", f'protocol error: worker answered "{answer.text}"')
                stats.failed(w.stage, seconds)
                log.warning(
                    "stage %s worker pid %d: protocol error on message %d: %r; stopping it",
                    w.stage,
                    w.pid,
                    wid,
                    answer.text[:200],
                )
                self._kill(w, now)
                if pool is not None and w.answered == 1:
                    # Garbage as its very first answer (a banner on stdout, a wrong
                    # PROGRAM): without a pause each replacement would fail the
                    # next message at once.
                    pool.start_cooldown(now, f"worker pid {w.pid}'s first answer was garbage")
                break
        if pool is not None and not w.killed:
            pool.success()
        self.requeue_dirty = True
        ledger.want_claim()
        if not inflight and not w.killed:
            w.idle_since = now
            if not w.stopping:
                if w.retiring:
                    self._stop_worker(w, now, "retired by a reload")
                elif pool is not None and w.sent >= pool.max_messages:
                    # Recycled once drained; a replacement is spawned on demand.
                    self._stop_worker(w, now, f"MAX_MESSAGES ({pool.max_messages}) reached")

    def _fused_allowed(self, w: Worker, fused: tuple[str, ...]) -> tuple[str, ...]:
        """The stages of ``0 fused=...`` if the graph allows them, else none.

        Each name must be a configured stage that NEXT of the one before it
        (the worker's own stage first) names; otherwise the worker's claim is
        not counted in any stage's statistics (a typo must not create stats
        rows for stages that do not exist).
        """
        if not fused:
            return fused
        stages = self.config.stages
        prev = w.stage
        for name in fused:
            here = stages.get(prev)
            if here is None or name not in here.next or name not in stages:
                log.warning(
                    "stage %s worker pid %d answered 'fused=%s', but %s is not a successor"
                    " of %s (NEXT); fused stages not counted",
                    w.stage,
                    w.pid,
                    ",".join(fused)[:200],
                    name[:64],
                    prev,
                )
                return ()
            prev = name
        return fused

    def _on_stderr(self, w: Worker) -> None:
        lines = w.read_stderr()
        if lines is None:
            self._unwatch(w.stderr_fd)
            if w.proc.stderr is not None:
                w.proc.stderr.close()
            w.stderr_fd = None
            return
        for line in lines:
            log.info("[%s %d] %s", w.stage, w.pid, line)

    def _unwatch(self, fd: int | None) -> None:
        if fd is None:
            return
        try:
            self.sel.unregister(fd)
        except (KeyError, ValueError):
            pass

    # == workers =================================================================
    def _spawn(self, pool: StagePool) -> Worker | None:
        env = worker_env(os.environ, pool.name, self.config.dsn, self.dispatcher_id)
        now = time.monotonic()
        try:
            w = Worker(pool.name, pool.config.program, self.dc.config_file, env, pool.generation)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            # OSError: not found / not executable / exec failed; ValueError: PROGRAM
            # does not split (unbalanced quotes); SubprocessError: the child set-up failed.
            pool.start_cooldown(
                now, f"cannot start PROGRAM {pool.config.program!r}: {exc} (rows stay pending)"
            )
            return None
        pool.workers.append(w)
        self.sel.register(w.stdout_fd, selectors.EVENT_READ, ("out", w))
        self.sel.register(w.stderr_fd, selectors.EVENT_READ, ("err", w))
        log.info(
            "stage %s: worker pid %d started (%d/%d)",
            pool.name,
            w.pid,
            len(pool.workers),
            pool.parallelism,
        )
        return w

    def _stop_worker(self, w: Worker, now: float, why: str) -> None:
        """Ask an idle worker to go: EOF on stdin (it exits 0)."""
        w.stopping = True
        w.stop_deadline = now + self.dc.shutdown_timeout
        self._unwatch(w.stdin_fd)
        w.close_stdin()
        w.stop_reason = why
        log.debug("stage %s worker pid %d: stopping (%s)", w.stage, w.pid, why)

    def _kill(self, w: Worker, now: float) -> None:
        """SIGKILL ``w``; its remaining ids are released once it is reaped."""
        w.kill()
        self.sigchld = True  # reap it in this very iteration if it is gone already
        w.stopping = True
        self._unwatch(w.stdin_fd)
        w.close_stdin()

    def _reap(self, now: float) -> None:
        """Collect exited workers; settle their unanswered ids (they are dead now)."""
        check_all = self.sigchld
        self.sigchld = False
        for _ in range(8):  # bounded; the next SIGCHLD comes back here anyway
            for w in self._all_workers():
                if not (check_all or w.killed or w.eof):
                    continue
                rc = w.poll()
                if rc is None:
                    continue
                self._finalize(w, rc, now)
            if not check_all:
                return
            # As child subreaper: reap grandchildren that outlived their worker.
            reaped, worker_waiting = reap_orphans({w.pid for w in self._all_workers()})
            for pid in reaped:
                log.debug("reaped pid %d, an orphaned descendant of a worker", pid)
            if not worker_waiting:
                return

    def _finalize(self, w: Worker, rc: int, now: float) -> None:
        pool = self._pool_of(w)
        # Answers written before it exited may still sit in the pipe.
        if not w.killed and w.stdout_fd is not None:
            try:
                for _ in range(64):  # bounded: a grandchild may still hold the pipe open
                    lines = w.read_answers()
                    if not lines:
                        break
                    self._answers(w, lines, now)
            except Exception:  # noqa: BLE001 - its last answers must not end the loop
                log.exception(
                    "stage %s worker pid %d: unexpected error handling its last answers",
                    w.stage,
                    w.pid,
                )
        if w.stderr_fd is not None:
            self._on_stderr(w)  # last words, at most one chunk burst
        # Asked while its stdin is still open: FIONREAD tells if it read anything.
        started = w.has_read()
        self._unwatch(w.stdout_fd)
        self._unwatch(w.stderr_fd)
        self._unwatch(w.stdin_fd)
        w.close_fds()
        if pool is not None:
            pool.workers.remove(w)
            if pool in self.leftover and not pool.workers:
                self.leftover.remove(pool)
        ids = list(w.inflight)
        undelivered = list(w.undelivered)
        # Never written to the worker (EPIPE): they did not start; released.
        self.ledger.reaped(w, ids, undelivered)
        w.undelivered.clear()
        w.inflight.clear()
        kind = classify_exit(
            rc,
            killed=w.killed,
            stopping=w.stopping,
            shutting_down=self.shutting_down,
            unanswered=len(ids),
            undelivered=len(undelivered),
            started=started,
            db_connected=self.db_ok,
        )
        self._settle_exit(w, pool, kind, rc, ids, len(undelivered), now)
        self.ledger.want_claim()

    def _settle_exit(
        self,
        w: Worker,
        pool: StagePool | None,
        kind: ExitKind,
        rc: int,
        ids: list[int],
        n_undelivered: int,
        now: float,
    ) -> None:
        """Settle the unanswered ``ids`` of the dead worker ``w`` as ``kind`` says."""
        exit_text = describe_exit(rc).removeprefix("worker ")
        cooled = False
        if kind is ExitKind.CRASH:
            # A crash: the head-of-line message fails, the rest never ran.
            head, rest = ids[0], ids[1:]
            reason = describe_exit(rc)
            self.ledger.crashed(ids, reason)
            self.stats.crashed(w.stage, now - w.head_since)
            log.warning(
                "stage %s worker pid %d crashed: %s; message %d failed, %d released",
                w.stage,
                w.pid,
                reason,
                head,
                len(rest),
            )
        else:
            self.ledger.release(ids)
        if kind is ExitKind.DIED_BEFORE_READING:
            # Its head-of-line message never started, so nothing fails --
            # otherwise a broken PROGRAM (bad arguments, a missing library) would
            # slowly fail the whole backlog, one message per cooldown.
            if pool is not None:
                pool.start_cooldown(
                    now,
                    f"worker pid {w.pid} {exit_text} before reading its input"
                    f" ({len(ids) + n_undelivered} message(s) stay pending)",
                )
                cooled = True
        elif kind is ExitKind.TEMPFAIL:
            # "I could not reach the database; nothing I held is done."
            if pool is not None:
                pool.start_cooldown(
                    now,
                    f"worker pid {w.pid} could not reach the database (exit {EX_TEMPFAIL});"
                    f" {len(ids)} message(s) released",
                )
                cooled = True
            else:
                log.warning(
                    "stage %s worker pid %d could not reach the database (exit %d);"
                    " %d message(s) released",
                    w.stage,
                    w.pid,
                    EX_TEMPFAIL,
                    len(ids),
                )
        elif kind is ExitKind.DB_DOWN:
            log.warning(
                "stage %s worker pid %d %s while the database is unreachable;"
                " %d message(s) released, none failed",
                w.stage,
                w.pid,
                exit_text,
                len(ids),
            )
        elif kind is ExitKind.KILLED:
            log.info(
                "stage %s worker pid %d killed; %d message(s) released", w.stage, w.pid, len(ids)
            )
        elif kind is ExitKind.STOPPED:
            # Dying of the SIGTERM we sent is a normal way to stop.
            normal = rc == 0 or (self.shutting_down and rc == -signal.SIGTERM)
            log.log(
                logging.INFO if normal else logging.WARNING,
                "stage %s worker pid %d stopped (%s): %s%s",
                w.stage,
                w.pid,
                w.stop_reason or "dispatcher stopping",
                exit_text,
                f"; {len(ids)} message(s) released" if ids else "",
            )
        elif kind is ExitKind.EXITED:
            log.warning("stage %s worker pid %d exited unexpectedly: %s", w.stage, w.pid, exit_text)
        expected = w.stopping or self.shutting_down
        if (
            pool is not None
            and not cooled
            and not expected
            and not w.killed
            and w.answered == 0
            and not self.shutting_down
        ):
            pool.start_cooldown(now, f"worker pid {w.pid} died before answering anything")

    def _timers(self, now: float) -> None:
        """Watchdog, idle stops, stop deadlines, shutdown deadline, reconnects."""
        if not self.db_ok and now >= self.reconnect_at:
            self._reconnect(now)
        if self.db_ok and now >= self.next_heartbeat and now >= self.db_hold_until:
            if self.shutting_down:
                self._shutdown_heartbeat(now)
            else:
                self._heartbeat(now)
        for pool in self.pools.values():
            if pool.cooldown_until and now >= pool.cooldown_until:
                pool.cooldown_until = 0.0  # the delay is kept, so the next one grows
                self.ledger.want_claim()
                log.info("stage %s: cooldown over, starting workers again", pool.name)
        max_runtime = self.dc.max_runtime
        startup_limit = max(max_runtime, STARTUP_MIN)
        idle_timeout = self.dc.worker_idle_timeout
        for w in self._all_workers():
            if w.killed:
                continue
            if w.inflight and not w.reading:
                # Not started yet: the head's clock starts when it reads its input.
                if w.has_read():
                    w.head_since = now
                elif now - w.first_given >= startup_limit:
                    log.warning(
                        "stage %s worker pid %d read none of its input within %g s"
                        " of being started; killing it",
                        w.stage,
                        w.pid,
                        startup_limit,
                    )
                    self._kill(w, now)
                    pool = self._pool_of(w)
                    if pool is not None:
                        pool.start_cooldown(now, f"worker pid {w.pid} never started reading")
                continue
            if w.inflight and now - w.head_since >= max_runtime:
                head = w.inflight.popleft()
                self.ledger.let_go(head, w, head in w.inflight)
                seconds = now - w.head_since
                reason = f"timeout: no answer within MAX_RUNTIME ({max_runtime:g} s); worker killed"
                self.ledger.failed(head, "timeout", reason)
                self.stats.timed_out(w.stage, seconds)
                log.warning(
                    "stage %s worker pid %d: message %d unanswered after %.1f s "
                    "(MAX_RUNTIME); killing the worker",
                    w.stage,
                    w.pid,
                    head,
                    seconds,
                )
                self._kill(w, now)
            elif w.eof and now - w.eof_at >= EOF_GRACE:
                log.warning(
                    "stage %s worker pid %d closed stdout but did not exit; killing it",
                    w.stage,
                    w.pid,
                )
                self._kill(w, now)
            elif w.stopping and w.stop_deadline and now >= w.stop_deadline:
                log.warning(
                    "stage %s worker pid %d did not exit within SHUTDOWN_TIMEOUT; killing it",
                    w.stage,
                    w.pid,
                )
                self._kill(w, now)
            elif (
                not w.inflight
                and not w.stopping
                and not w.eof
                and now - w.idle_since >= idle_timeout
            ):
                self._stop_worker(w, now, "idle")
        if self.shutting_down and now >= self.shutdown_deadline:
            for w in self._all_workers():
                if not w.killed:
                    log.warning(
                        "stage %s worker pid %d still running after SHUTDOWN_TIMEOUT; killing it",
                        w.stage,
                        w.pid,
                    )
                    self._kill(w, now)
            # Killed children go away in milliseconds; wait for them here so the
            # shutdown does not spin on the 10 ms reap timer.
            for w in self._all_workers():
                rc = w.wait_dead()
                self._finalize(w, rc, now)

    # == database ================================================================
    def _db_iteration(self, now: float) -> None:
        """This iteration's database work, in one pipeline; then place claimed ids."""
        requeue = None
        if (
            not self.shutting_down
            and now >= self.requeue_blocked_until
            and (
                now >= self.requeue_at
                or (self.requeue_dirty and now - self.last_requeue >= REQUEUE_AFTER_ANSWERS)
            )
        ):
            requeue = self._requeue_args()
        claim = None
        stages: list[str] = []
        caps: list[int] = []
        # With a requeue in the pipeline, claim too: the claim runs after it and
        # picks up the rows it just made pending, in the same round trip.
        ledger = self.ledger
        if (ledger.claim_needed or requeue) and not self.shutting_down:
            for name, pool in self.pools.items():
                cap = pool.capacity(now)
                if cap > 0:
                    stages.append(name)
                    caps.append(cap)
        # An id owed a write may meanwhile be in flight again at its next stage
        # (the stage advanced it, we claimed it, then read the old answer): the
        # ledger drops such writes (and lowers the floors first).
        owed = ledger.owed()
        errors, answered, release = owed.failures, owed.checks, owed.releases
        if stages:
            # A requeue in the same pipeline may make low ids pending just before
            # the claim: that claim goes unbounded (about once a second when busy).
            claim = (stages, caps, ledger.claim_bounds(stages, requeue is not None))
        if owed or requeue or claim:
            try:
                if release:
                    # Separate statement first: released rows become claimable in
                    # the same iteration's claim.
                    self.db.release(self.dispatcher_id, release)
                    log.debug("released %d row(s): %s", len(release), ids_text(release))
                ledger.released()
                t0 = time.monotonic()
                result = self.db.iteration(self.dispatcher_id, errors, answered, requeue, claim)
                self.stats.round_trip(time.monotonic() - t0, claim is not None)
                self.round_trips += 1
            except psycopg.Error as exc:
                if not self._poisoned(exc):
                    self._db_lost(now, exc)
                    return
                isolated = self._isolate(now, exc, errors, answered, requeue, claim)
                if isolated is None:
                    return
                result = isolated
            ledger.sent()
            ledger.claimed_pass()
            self.db_hold.reset()
            self._after_iteration(result, now)
        self._maybe_flush(now)

    def _poisoned(self, exc: psycopg.Error) -> bool:
        """Did a statement fail for what it was given, the connections being fine?

        Lost connections, timeouts and cancels (OperationalError) are the
        database's trouble, handled by _db_lost; anything else with both
        connections intact (a data error, a limit, a raising trigger) may be
        one bad row or stage poisoning the shared round trip.
        """
        if isinstance(exc, CONNECTION_LOST):
            return False
        return not (self.db.work_dead() or self.db.listen_dead())

    def _isolate(
        self,
        now: float,
        exc: psycopg.Error,
        errors: list[tuple[int, str, str]],
        answered: list[int],
        requeue: tuple[list[str], list[int], int, float | None] | None,
        claim: tuple[list[str], list[int], list[int | None] | None] | None,
    ) -> IterationResult | None:
        """The pipelined round trip failed with the connections intact: run its
        parts one statement at a time, so that one poisoned row or stage stops
        only itself. Rows whose write keeps failing are failed with a short
        dispatch_error saying why; a failing requeue is skipped for a while; a
        stage whose claim fails cools down. None if the connection broke
        meanwhile (then _db_lost has run; the owed writes are kept and are
        idempotent, fenced by dispatcher id)."""
        log.error("database round trip failed (%s); running its parts one by one", _one_line(exc))
        result = IterationResult([], None, [])
        try:
            if errors:
                self._record_errors_alone(errors)
            if answered:
                result.left_running = self._check_answered_alone(answered)
            if requeue is not None:
                result.requeue = self._requeue_alone(now, requeue)
            if claim is not None:
                result.claimed = self._claim_by_stage(now, claim)
        except psycopg.Error as lost:
            self._db_lost(now, lost)
            return None
        self.round_trips += 1
        return result

    def _record_errors_alone(self, errors: list[tuple[int, str, str]]) -> None:
        try:
            self.db.record_errors(self.dispatcher_id, errors)
            return
        except psycopg.Error as exc:
            if not self._poisoned(exc):
                raise
        for e in errors:
            try:
                self.db.record_errors(self.dispatcher_id, [e])
            except psycopg.Error as exc:
                if not self._poisoned(exc):
                    raise
                self._fail_poisoned(e[0], f"its {e[1]} could not be recorded", exc)

    def _check_answered_alone(self, answered: list[int]) -> list[tuple[int, str]]:
        try:
            return self.db.check_answered(self.dispatcher_id, answered)
        except psycopg.Error as exc:
            if not self._poisoned(exc):
                raise
        out: list[tuple[int, str]] = []
        for wid in answered:
            try:
                out.extend(self.db.check_answered(self.dispatcher_id, [wid]))
            except psycopg.Error as exc:
                if not self._poisoned(exc):
                    raise
                self._fail_poisoned(wid, "checking its answer 0 failed", exc)
        return out

    def _fail_poisoned(self, wid: int, what: str, exc: psycopg.Error) -> None:
        """Take a row whose write keeps failing out of the way: fail it with a
        short dispatch_error saying why (log ERROR). Raises on a lost connection."""
        reason = f"dispatch error: {what}: {_one_line(exc)[:300]}"
        log.error("message %d: %s; failing it", wid, reason.removeprefix("dispatch error: "))
        try:
            self.db.record_errors(self.dispatcher_id, [(wid, "failed", reason)])
        except psycopg.Error as again:
            if not self._poisoned(again):
                raise
            log.error(
                "message %d: cannot fail it either (%s); it stays running, held by this"
                " dispatcher, until a restart resets it",
                wid,
                _one_line(again),
            )

    def _requeue_alone(
        self, now: float, requeue: tuple[list[str], list[int], int, float | None]
    ) -> Requeue | None:
        try:
            return self.db.requeue_due(*requeue)
        except psycopg.Error as exc:
            if not self._poisoned(exc):
                raise
            log.error(
                "requeue_due failed (%s); paused rows are not requeued, next try in %g s",
                _one_line(exc),
                REQUEUE_RETRY_AFTER_ERROR,
            )
            self.requeue_at = self.requeue_blocked_until = now + REQUEUE_RETRY_AFTER_ERROR
            return None

    def _claim_by_stage(
        self, now: float, claim: tuple[list[str], list[int], list[int | None] | None]
    ) -> list[tuple[int, str]]:
        stages, caps, after_ids = claim
        try:
            return self.db.claim(self.dispatcher_id, stages, caps, after_ids)
        except psycopg.Error as exc:
            if not self._poisoned(exc):
                raise
        out: list[tuple[int, str]] = []
        for i, stage in enumerate(stages):
            after = None if after_ids is None else [after_ids[i]]
            try:
                out.extend(self.db.claim(self.dispatcher_id, [stage], [caps[i]], after))
            except psycopg.Error as exc:
                if not self._poisoned(exc):
                    raise
                log.error("stage %s: claim failed: %s", stage, _one_line(exc))
                pool = self.pools.get(stage)
                if pool is not None:
                    pool.start_cooldown(now, "its claim failed (see the ERROR line above)")
        return out

    def _requeue_args(self) -> tuple[list[str], list[int], int, float | None]:
        stages = list(self.pools)
        retries = [self.pools[s].config.max_retries for s in stages]
        # Rows of stages no longer configured get the default cap (10).
        # EXPIRY = 0 means "never expire" (NULL), not "expire everything at once".
        return (stages, retries, 10, self.dc.expiry if self.dc.expiry > 0 else None)

    def _after_iteration(self, result: IterationResult, now: float) -> None:
        for wid, stage in result.left_running:
            log.warning(
                "stage %s answered 0 for message %d but left it running; failed it",
                stage,
                wid,
            )
        if result.requeue is not None:
            self._requeued(result.requeue, now)
        if self._count_retried(result):
            self.requeue_at = now  # learn when they are due
        if result.claimed:
            self.ledger.raise_floors(result.claimed)
            self._place(result.claimed, now)

    def _count_retried(self, result: IterationResult) -> bool:
        """Failures record_dispatch_error paused for an automatic retry (RETRY_DELAY)
        are not failures in the statistics; True if there were any."""
        for _wid, stage, status, reason in result.retried:
            self.stats.retried(stage, status, reason)
        return bool(result.retried)

    def _requeued(self, r: Requeue, now: float) -> None:
        self.last_requeue = now
        self.requeue_dirty = False
        if r.next_due_in is None:
            self.requeue_at = INF
        elif r.next_due_in <= 0:
            # More were due than one call moves: go again soon.
            self.requeue_at = now + (0.01 if r.requeued else 1.0)
        else:
            # +5 ms: wake just after the row is due, not just before.
            self.requeue_at = now + r.next_due_in + 0.005
        if r.requeued:
            self.ledger.forget_floors()  # requeued rows are pending again with their low ids
        if r.requeued or r.exhausted or r.expired:
            self.stats.requeued += r.requeued
            self.stats.expired += r.expired
            for stage, n in r.exhausted_by_stage:
                self.stats.exhausted(stage, n)
            self.ledger.want_claim()
            # One INFO line per minute at most (the first one at once): a stage
            # that pauses a lot would otherwise log every second all hour.
            sums = self._requeue_sums
            sums[0] += r.requeued
            sums[1] += r.exhausted
            sums[2] += r.expired
            if now - self._requeue_logged >= REQUEUE_LOG_EVERY:
                self._log_requeues(now)
            else:
                log.debug(
                    "paused rows due: %d requeued, %d exhausted, %d expired",
                    r.requeued,
                    r.exhausted,
                    r.expired,
                )

    def _log_requeues(self, now: float) -> None:
        sums = self._requeue_sums
        if any(sums):
            log.info(
                "paused rows due%s: %d requeued, %d failed (retries exhausted), %d expired",
                "" if self._requeue_logged == -INF else " since the last such line",
                *sums,
            )
        self._requeue_sums = [0, 0, 0]
        self._requeue_logged = now

    def _place(self, claimed: list[tuple[int, str]], now: float) -> None:
        """Hand claimed ids to workers, one write per worker; release what finds no place."""
        by_stage: dict[str, list[int]] = {}
        for wid, stage in claimed:
            by_stage.setdefault(stage, []).append(wid)
        debug = log.isEnabledFor(logging.DEBUG)
        for stage, ids in by_stage.items():
            pool = self.pools.get(stage)
            if pool is None:
                self.ledger.release(ids)
                continue
            assignments, unplaced = pool.place(ids, now, self._spawn)
            for w, batch in assignments:
                # An id may still sit unanswered at its previous stage's worker: that
                # stage committed the advance (the claim takes pending rows only) and
                # its answer is on the way. The new worker owns it now; the old answer
                # then leaves it alone. It may also be the same worker (the stage
                # advanced the row to itself): then `w` holds the id twice and only
                # its last answer lets go of it.
                self.ledger.hand(batch, w)
                w.give(batch, now)
                if w.outbuf and w.stdin_fd is not None:
                    try:
                        self.sel.register(w.stdin_fd, selectors.EVENT_WRITE, ("in", w))
                    except KeyError:
                        pass
                self.stats.handed_out(len(batch))
                if debug:
                    log.debug("stage %s pid %d: given %s", stage, w.pid, ids_text(batch))
            if unplaced:
                self.ledger.release(unplaced)
        # A claim that filled capacity may have left more pending rows behind;
        # answers will free room and trigger the next claim.

    def _maybe_flush(self, now: float, force: bool = False) -> None:
        if not self.stats.pending():
            return
        due = now - self.last_flush >= self.dc.stats_interval
        if not due and now - self.last_flush >= IDLE_FLUSH_MIN:
            due = not any(w.inflight for w in self._all_workers())
        if not (due or force):
            return
        try:
            self.db.flush_stats(self.stats.flush_args())
        except psycopg.Error as exc:
            if not self._poisoned(exc):
                self._db_lost(now, exc)
                return
            # Deltas the database refuses would block every later flush (and,
            # through _db_lost, all database work): drop them, loudly.
            log.error("statistics flush failed (%s); these deltas are dropped", _one_line(exc))
        self.stats.clear()
        self.last_flush = now

    def _shutdown_heartbeat(self, now: float) -> None:
        """While stopping: only say we are alive (no claims, resets or purges).

        In competing mode a replica whose heartbeat is older than
        ORPHAN_TIMEOUT has its rows reset by the others -- while its workers
        may still be finishing them within SHUTDOWN_TIMEOUT.
        """
        self.next_heartbeat = now + self.heartbeat_interval
        try:
            self._check_registration(now)
            self.db.heartbeat(self.dispatcher_id)
        except psycopg.Error as exc:
            self._db_lost(now, exc)

    def _check_registration(self, now: float) -> None:
        """Competing: were we declared dead (heartbeat older than ORPHAN_TIMEOUT)?

        Then another replica has reset our running rows, and may already run
        them. Before the heartbeat registers us again, every worker is killed
        and every id it held, or that we owed a write for, is dropped: none of
        them is ours any more (a late write would be refused by the fencing
        token anyway, but the work itself must stop).
        """
        if not self.dc.competing or self.db.registered(self.dispatcher_id):
            return
        workers = self._all_workers()
        held = sum(len(w.inflight) + len(w.undelivered) for w in workers)
        for w in workers:
            w.wait_dead()  # SIGKILL to the group, then reap
            self._unwatch(w.stdout_fd)
            self._unwatch(w.stderr_fd)
            self._unwatch(w.stdin_fd)
            w.close_fds()
            w.inflight.clear()
            w.undelivered.clear()
        for pool in self.pools.values():
            pool.workers.clear()
        self.leftover.clear()
        self.ledger.drop_all()
        log.error(
            "this replica was declared dead by another (its heartbeat was older than"
            " ORPHAN_TIMEOUT) and its rows were reset; killed %d worker(s) and dropped"
            " %d message(s) they held; registering again",
            len(workers),
            held,
        )

    def _heartbeat(self, now: float) -> None:
        self.next_heartbeat = now + self.heartbeat_interval
        # Rows made pending without a notification (an operator's requeue_failed)
        # are claimed at the latest on this tick (when busy, within about a second:
        # a claim in the same pipeline as requeue_due goes unbounded).
        self.ledger.forget_floors()
        try:
            self._check_registration(now)
            self.db.heartbeat(self.dispatcher_id, gauges.collect(self))
            self.db.ping_listen()
            self._on_listen(now)  # notifications that arrived during the ping
            if not self.db_ok:
                return
            if self.stages_unregistered:
                self._register_stages(now)
            if self.dc.competing:
                n = self.db.reset_orphans(self.dispatcher_id, self.dc.orphan_timeout)
                if n:
                    log.info("reset %d orphaned running row(s) of dead replicas to pending", n)
            if self.dc.retention > 0:
                purged = 0
                for _ in range(PURGE_MAX_BATCHES):
                    n = self.db.purge_done(self.dc.retention, PURGE_BATCH)
                    purged += n
                    if n < PURGE_BATCH:
                        break
                if purged:
                    log.info("purged %d done row(s) older than RETENTION", purged)
        except psycopg.Error as exc:
            self._db_lost(now, exc)
            return
        self.requeue_at = now
        self.ledger.want_claim()

    def _db_lost(self, now: float, exc: BaseException) -> None:
        """A database call failed: keep owed writes; reconnect only what is broken.

        A plain query error (lock_timeout, statement_timeout, a deadlock after
        its retries, a bad argument) leaves both connections usable: they are
        kept -- the listen connection holds the advisory lock, and giving it up
        would let another dispatcher start and reset our in-flight rows -- and
        the database work is retried after a growing pause. A broken work
        connection alone is reopened alone; only a broken listen connection
        means a full reconnect (lock, LISTEN, claim pass).
        """
        listen_dead = self.db.listen_dead()
        if self.db_ok and not listen_dead and not self.db.work_dead():
            hold = self.db_hold.next()
            self.db_hold_until = now + hold
            if now - self.last_query_error_log >= 30.0:
                self.last_query_error_log = now
                log.warning(
                    "database error (%s); connections kept, retrying in %g s (growing)",
                    _one_line(exc),
                    hold,
                )
            else:
                log.debug("database error (%s); retrying in %g s", _one_line(exc), hold)
            return
        if self.db_ok:
            log.warning(
                "database trouble (%s); reconnecting%s, workers keep running",
                _one_line(exc),
                "" if listen_dead else " the work connection",
            )
            self.reconnect_backoff.reset()
            self.reconnect_failures = 0
            self.last_down_log = now
        self.db_ok = False
        if listen_dead:
            self.reconnect_work_only = False
            if self._listen_fd >= 0:
                # By the number registered: a broken connection no longer knows its socket.
                self._unwatch(self._listen_fd)
                self._listen_fd = -1
            self.db.close()
        else:
            self.reconnect_work_only = True
            self.db.close_work()
        self.reconnect_at = now + self.reconnect_backoff.next()

    def _reconnect(self, now: float) -> None:
        work_only = self.reconnect_work_only and not self.db.listen_dead()
        if not work_only and self._listen_fd >= 0:
            self._unwatch(self._listen_fd)
            self._listen_fd = -1
        try:
            if work_only:
                # The listen connection still holds the lock and LISTENs.
                self.db.connect_work()
                locked = True
            else:
                self.db.connect()
                locked = self.db.try_lock()
            if not locked and self._retake_lock_later(now):
                return
            if not locked:
                holders = self.db.lock_holders()
                self.lock_lost = (
                    "lost the database to another dispatcher while reconnecting "
                    f"({holders}); stopping"
                )
            else:
                if not work_only:
                    self.db.start_listening()
                # Away longer than ORPHAN_TIMEOUT, we may have been declared dead.
                self._check_registration(now)
                self.db.heartbeat(self.dispatcher_id)
                # Rows the database says we hold but no worker has (a claim that
                # committed while its answer was lost) go back to pending; rows
                # with an owed failure or answer check are left for those writes.
                stray = self._strays()
                if stray:
                    self.db.release(self.dispatcher_id, stray)
                    log.info("released %d claimed row(s) no worker had", len(stray))
        except psycopg.Error as exc:
            self.reconnect_failures += 1
            if now - self.last_down_log >= 30.0:
                self.last_down_log = now
                log.warning(
                    "database still unreachable after %d attempt(s): %s; retrying every %g s",
                    self.reconnect_failures,
                    _one_line(exc),
                    RECONNECT_MAX,
                )
            else:
                log.debug("reconnect failed: %s", _one_line(exc))
            if work_only:
                self.db.close_work()
            else:
                self.db.close()
            self.reconnect_at = now + self.reconnect_backoff.next()
            return
        if self.lock_lost:
            self._abort_fatal()
            return
        self.db_ok = True
        self.reconnect_work_only = False
        self.db_hold_until = 0.0
        self.lock_retake_deadline = 0.0
        if not work_only:
            self.listen_pid = self.db.listen_pid()
        log.info(
            "database connection re-established%s; %s, full claim pass",
            f" after {self.reconnect_failures} failed attempt(s)"
            if self.reconnect_failures
            else "",
            "work connection only (lock and LISTEN kept)" if work_only else "LISTEN renewed",
        )
        self.reconnect_failures = 0
        self.reconnect_backoff.reset()
        self.ledger.rescan()  # stray rows were released; notifications may be lost
        self.requeue_at = now
        if work_only:
            return  # no notification was missed: the listen connection stayed
        self._watch_listen()
        # A config_changed may have been missed while disconnected: reload, but
        # retire workers only if the stage table really changed.
        self.reload_pending = True
        self.reload_if_changed = True

    def _strays(self) -> list[int]:
        """Rows the database says we hold but no worker has (after a reconnect).

        A claim that committed while its reply was lost with the connection
        left such rows running. Rows with an owed write are normally left for
        that write -- except a row owed an answer check that is no longer at
        the stage its answer was for (the last fused stage, if any): the stage
        advanced it, and the lost claim took it again. Its check would fail a
        healthy row for being "left running"; it is released instead (the
        last-fused-stage guard, docs/INTERNALS.md).
        """
        held = self.db.held(self.dispatcher_id)
        checks = self.ledger.checks_to_verify(held)
        return self.ledger.strays(held, self.db.stages_of(checks) if checks else None)

    def _retake_lock_later(self, now: float) -> bool:
        """try_lock failed on reconnect: is the holder our own old session?

        After a network partition longer than the client keepalives, the
        server-side backend of the OLD listen connection may still be alive and
        hold the lock. Then it is terminated and the reconnect retried shortly
        (True); only once that window is over, or when the holder is another
        session, is the lock lost (False). The work connection is open here.
        """
        if self.lock_retake_deadline and now >= self.lock_retake_deadline:
            return False
        pids = self.db.lock_pids()
        old = self.listen_pid
        if pids and old not in pids:
            return False  # another session holds it
        if not self.lock_retake_deadline:
            self.lock_retake_deadline = now + LOCK_RETAKE_WINDOW
        if old in pids:
            log.warning(
                "reconnect: the dispatcher lock is still held by our old listen session"
                " (server pid %d, from before the connection broke); terminating it",
                old,
            )
            try:
                self.db.terminate_backend(old)
            except psycopg.Error as exc:
                log.warning("cannot terminate server pid %d: %s", old, _one_line(exc))
        self.db.close()
        self.reconnect_at = now + LOCK_RETAKE_RETRY
        return True

    def _abort_fatal(self) -> None:
        """Another dispatcher owns the database: kill our workers and stop.

        Before going, the owed writes and the stats are still sent (best
        effort): the writes are fenced by dispatcher_id, so they change only
        rows still held by this dispatcher.
        """
        for w in self._all_workers():
            w.wait_dead()
            w.close_fds()
        self.pools.clear()
        self.leftover.clear()
        if not self.db.work_dead():
            owed = self.ledger.owed()  # only writes about ids no worker holds
            errors, answered = owed.failures, owed.checks
            try:
                if errors or answered:
                    self._count_retried(
                        self.db.iteration(self.dispatcher_id, errors, answered, None, None)
                    )
                    self.ledger.sent_writes()
                if self.stats.pending():
                    self.db.flush_stats(self.stats.flush_args())
                    self.stats.clear()
            except psycopg.Error as exc:
                log.warning("could not settle owed writes and stats: %s", _one_line(exc))
        raise FatalError(self.lock_lost or self.fatal or "fatal error")

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
        except psycopg.Error as exc:
            self.reload_pending = True
            self.reload_if_changed = only_if_changed
            if cause is ReloadCause.SIGHUP:
                self.reload_cause = cause
            self._db_lost(now, exc)
            return
        self.file_config = base
        if only_if_changed and new.stages == self.config.stages:
            return
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
        self.config = replace(new, dsn=self.config.dsn, dispatch=self.dc)
        self._register_stages(now)
        n = 0
        for w in self._all_workers():
            if not w.retiring:
                w.retiring = True
                n += 1
                if not w.inflight and not w.stopping:
                    self._stop_worker(w, now, "reload")
        self._build_pools(self.config)
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
        except psycopg.Error as exc:
            self._db_lost(now, exc)
            return
        self.stages_unregistered = False

    # == shutdown ================================================================
    def _begin_shutdown(self, now: float) -> None:
        if self.shutting_down:
            return
        self.shutting_down = True
        self.shutdown_deadline = now + self.dc.shutdown_timeout
        workers = self._all_workers()
        log.info(
            "stopping: no more claims; SIGTERM to %d worker(s), SHUTDOWN_TIMEOUT %g s",
            len(workers),
            self.dc.shutdown_timeout,
        )
        for w in workers:
            w.stopping = True
            w.signal(signal.SIGTERM)

    def _finish_shutdown(self) -> int:
        """All workers are gone: settle owed writes, release held rows, flush, unregister."""
        self._log_requeues(time.monotonic())
        deadline = time.monotonic() + max(self.dc.shutdown_timeout, 1.0)
        while True:
            now = time.monotonic()
            if not self.db_ok or now < self.db_hold_until:
                if now >= deadline:
                    log.error(
                        "stopped without %s: held rows stay running "
                        "until the next dispatcher resets them",
                        "a database connection" if not self.db_ok else "settling them (errors)",
                    )
                    return 1
                if self.db_ok:
                    time.sleep(max(0.0, min(self.db_hold_until, deadline) - now))
                    continue
                time.sleep(max(0.0, min(self.reconnect_at, deadline) - now))
                self._reconnect(time.monotonic())
                continue
            try:
                ledger = self.ledger
                if ledger.failures or ledger.checks:
                    self._count_retried(
                        self.db.iteration(
                            self.dispatcher_id, ledger.failures, ledger.checks, None, None
                        )
                    )
                    ledger.sent_writes()
                n = self.db.release(self.dispatcher_id, None)
                ledger.released()
                if self.stats.pending():
                    self.db.flush_stats(self.stats.flush_args())
                    self.stats.clear()
                self.db.unregister(self.dispatcher_id)
            except psycopg.Error as exc:
                self._db_lost(now, exc)
                continue
            break
        usage = resource.getrusage(resource.RUSAGE_SELF)
        log.info(
            "pepsi-dispatch stopped: dispatcher %d, %d message(s) handed out, %d stage run(s),"
            " %d database round trip(s), %.2f s CPU%s",
            self.dispatcher_id,
            self.stats.total_messages,
            self.stats.total_stage_runs,
            self.round_trips,
            usage.ru_utime + usage.ru_stime,
            f", {n} held row(s) released" if n else "",
        )
        if self.fatal:
            raise FatalError(self.fatal)
        return 0


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def serve(config: Config) -> int:
    """Run the dispatcher with ``config`` until SIGINT/SIGTERM; returns the exit code.

    Raises :class:`~pepsi_dispatch.errors.UsageError` (exit 2) when another
    dispatcher holds the database or the overlay is bad at start-up, and
    :class:`~pepsi_dispatch.errors.FatalError` (exit 1) for fatal runtime
    errors such as a reloaded graph that does not parse.
    """
    return Dispatcher(config).run()


__all__ = ["Dispatcher", "serve"]
