"""The worker supervisor: pools, spawning, fd registration, answer
intake, watchdogs and reaping.

It owns every worker process of the dispatcher. What the ids a worker held
become is recorded in the in-flight ledger (coordinator/ledger.py); how a
worker's end settles them is decided by :func:`process.classify_exit`. A
worker's life (:class:`process.Life`) changes only through its methods.

Every watchdog is one row of a table of (deadline, owner, action)
(workers/watchdogs.py): the loop's select timeout takes its earliest
deadline, and the same table fires the rows that are due, so the two can
never disagree.
"""

from __future__ import annotations

import logging
import os
import selectors
import subprocess
from collections.abc import Callable, Mapping
from enum import Enum

from pepsi_dispatch.config import Config, DispatchConfig
from pepsi_dispatch.config.values import INT_MAX
from pepsi_dispatch.contract import ROW_LINE_MAX
from pepsi_dispatch.coordinator.checks import program_problem
from pepsi_dispatch.coordinator.failwatch import FailureWatch
from pepsi_dispatch.coordinator.ledger import Ledger, ids_text
from pepsi_dispatch.coordinator.stats import Stats
from pepsi_dispatch.coordinator.workers.children import is_subreaper, worker_argv
from pepsi_dispatch.coordinator.workers.exits import ExitBooks, settle_exit
from pepsi_dispatch.coordinator.workers.intake import AnswerIntake
from pepsi_dispatch.coordinator.workers.process import WorkerProcess, classify_exit, reap_orphans
from pepsi_dispatch.coordinator.workers.sentinel import GroupSentinel
from pepsi_dispatch.coordinator.workers.stage_pool import StagePool, worker_env
from pepsi_dispatch.coordinator.workers.warm import WarmWorkers
from pepsi_dispatch.coordinator.workers.watchdogs import Watchdogs

log = logging.getLogger(__name__)

#: While a stage waits for its template (StagePool.template_on_its_way) or for
#: the greeting of one its stopped worker forked (StagePool.greeting_awaited),
#: how often to look whether it greeted (seconds): only at a stage's first
#: burst or probe.
TEMPLATE_POLL = 0.01


class SpawnFor(Enum):
    """Why a worker is started; the value ends its log line."""

    MESSAGES = ""  # ids are about to be placed on it
    SPARE = " as a warm spare (MAX_MESSAGES recycle)"
    WARM = " to keep MIN_WORKERS ({min_workers})"
    PROBE = " to fork the stage's template before its first message, if it can be one"


class Supervisor:
    """The dispatcher's workers, by stage."""

    def __init__(
        self,
        config: Config,
        sel: selectors.BaseSelector,
        stats: Stats,
        ledger: Ledger,
        db_connected: Callable[[], bool],
        on_answers: Callable[[], None],
        failwatch: FailureWatch,
    ) -> None:
        self.config = config
        #: stages failing everything (ERROR once per STATS_INTERVAL).
        self.failwatch = failwatch
        self.dispatch_config: DispatchConfig = config.dispatch
        self.sel = sel
        self.stats = stats
        self.ledger = ledger
        self.books = ExitBooks(ledger, failwatch, stats)
        #: reads answer lines into the ledger and the statistics.
        self.intake = AnswerIntake(ledger, stats, failwatch, self)
        #: is the dispatcher's own database connection up (for classify_exit)?
        self.db_connected = db_connected
        #: called after answers were read (the loop then runs requeue_due soon).
        self.on_answers = on_answers
        self.dispatcher_id = 0
        self.shutting_down = False
        self.generation = 0
        self.pools: dict[str, StagePool] = {}
        #: pools of stages a reload removed, kept until their workers are gone.
        self.leftover: list[StagePool] = []
        #: look at every worker for an exit status (SIGCHLD, an EOF, a kill).
        self.reap_all = False
        #: the watchdog table: workers/watchdogs.py.
        self.watchdogs = Watchdogs(self)
        #: MIN_WORKERS, a duty of the loop: workers/warm.py.
        self.warm = WarmWorkers(
            lambda: self.pools.values(), self.spawn_warm, lambda: not self.shutting_down
        )
        #: kills the workers' groups if the dispatcher dies (started by the loop).
        self.sentinel = GroupSentinel()
        #: are we a child subreaper (templates need it)? None: not looked yet.
        self._subreaper: bool | None = None
        #: new pools (a start, a reload) whose template probe is still to be
        #: looked at (:meth:`probe_templates`)
        self.probes_pending = False

    # == pools ===================================================================
    def all(self) -> list[WorkerProcess]:
        """Every worker, retiring ones and those of removed stages included."""
        out: list[WorkerProcess] = []
        for pool in self.pools.values():
            out.extend(pool.workers)
        for pool in self.leftover:
            out.extend(pool.workers)
        return out

    def pool_of(self, w: WorkerProcess) -> StagePool | None:
        pool = self.pools.get(w.stage)
        if pool is not None and w in pool.workers:
            return pool
        for p in self.leftover:
            if w in p.workers:
                return p
        return None

    def build(self, config: Config) -> None:
        """Pools for the stages of ``config``; running workers keep their pool."""
        self.config = config
        self.generation += 1
        self.probes_pending = True
        old = self.pools
        self.pools = {name: StagePool(sc, self.generation) for name, sc in config.stages.items()}
        for name, pool in old.items():
            if name in self.pools:
                self.pools[name].workers.extend(pool.workers)
                self.pools[name].take_history(pool)
            elif pool.workers:
                self.leftover.append(pool)
            pool.close_template()  # its workers are of the old configuration
        # A stage removed by one reload and added again by the next: the workers
        # of its old pool (retiring) still run and count against PARALLELISM.
        for pool in list(self.leftover):
            if pool.name in self.pools:
                self.pools[pool.name].workers.extend(pool.workers)
                self.leftover.remove(pool)

    def capacity(self, now: float) -> tuple[list[str], list[int]]:
        """Stages with room now and how many ids each can take (the claim; an int4
        in the database, so PARALLELISM x QUEUE_LIMIT above it claims INT_MAX)."""
        stages: list[str] = []
        caps: list[int] = []
        for name, pool in self.pools.items():
            cap = pool.capacity(now)
            if cap > 0:
                stages.append(name)
                caps.append(min(cap, INT_MAX))
        return stages, caps

    def has_room(self, now: float) -> bool:
        return any(p.capacity(now) > 0 for p in self.pools.values())

    def line_limits(self, stages: list[str]) -> list[int]:
        """For each stage, ROW_LINE_MAX once a worker of it said it takes rows on
        its pipe (the claim then returns rows as lines), else 0 (bare ids)."""
        return [ROW_LINE_MAX if self._takes_rows(stage) else 0 for stage in stages]

    def _takes_rows(self, stage: str) -> bool:
        pool = self.pools.get(stage)
        if pool is None:
            return False
        if not pool.takes_rows:
            pool.takes_rows = any(w.slot.takes_rows for w in pool.workers)
        return pool.takes_rows

    def hold_off(self, stage: str, now: float, why: str) -> None:
        """Claim nothing for ``stage`` for a while (its cooldown), saying ``why``."""
        pool = self.pools.get(stage)
        if pool is not None:
            pool.start_cooldown(now, why)

    def end_hold_offs(self, why: str, stage: str | None = None) -> int:
        """End the hold-off of ``stage`` (None: of every stage) at once -- a
        resume's "try now", a reload -- and claim for it; how many were held off."""
        pools = self.pools.values() if stage is None else [self.pools.get(stage)]
        n = sum(1 for pool in pools if pool is not None and pool.end_hold_off(why))
        if n:
            self.ledger.want_claim()  # their free slots count again
        return n

    # == timers =================================================================
    def next_deadline(self, now: float) -> float:
        """The earliest of the watchdog table's rows, the warm workers' duty
        (MIN_WORKERS), the template probes of new pools and the look for a
        template's greeting; INF: none."""
        if self.probes_pending:
            return now
        due = min(self.watchdogs.next_deadline(now), self.warm.next_due(now))
        if any(
            pool.holding_for_template or pool.greeting_awaited(now) for pool in self.pools.values()
        ):
            due = min(due, now + TEMPLATE_POLL)
        return due

    def fire_due(self, now: float) -> None:
        """The watchdog rows that are due, then the missing warm workers
        (MIN_WORKERS), then the template probes of new pools, then the greetings
        of templates whose worker stopped, then a claim for the stages whose
        template wait is over."""
        self.watchdogs.fire_due(now)
        if now >= self.warm.next_due(now):
            self.warm.run(now)
        if self.probes_pending:
            self.probe_templates(now)
        for pool in self.pools.values():
            if pool.greeting_awaited(now):
                pool.read_greeting()  # so a probe's template is known before the first burst
            if pool.holding_for_template and not pool.template_on_its_way(now):
                pool.holding_for_template = False
                self.ledger.want_claim()  # its free slots count again

    def busy(self) -> bool:
        """Does any worker have ids in flight?"""
        return any(w.inflight for w in self.all())

    # == fds =====================================================================
    def unwatch(self, fd: int | None) -> None:
        if fd is None:
            return
        try:
            self.sel.unregister(fd)
        except (KeyError, ValueError):
            pass

    def _unwatch_all(self, w: WorkerProcess) -> None:
        self.unwatch(w.stdout_fd)
        self.unwatch(w.stderr_fd)
        self.unwatch(w.stdin_fd)

    # == answer intake ===========================================================
    def on_ready(
        self, w: WorkerProcess, what: str, handle: Callable[[WorkerProcess, float], None]
    ) -> Callable[[float], None]:
        """The selector's callback for one of ``w``'s pipes: ``handle(w, now)``,
        where whatever goes wrong ends that worker (its ids are settled when it is
        reaped), never the dispatcher. ``what`` names the pipe's job in the log."""

        def ready(now: float) -> None:
            try:
                handle(w, now)
            except Exception:  # noqa: BLE001 - one worker's output must not end the loop
                log.exception(
                    "stage %s worker pid %d: unexpected error handling its %s; stopping it",
                    w.stage,
                    w.pid,
                    what,
                )
                if not w.killed:
                    self.kill(w)

        return ready

    def _on_stdin(self, w: WorkerProcess, now: float) -> None:
        if w.flush_stdin():
            self.unwatch(w.stdin_fd)

    def _on_stdout(self, w: WorkerProcess, now: float) -> None:
        lines = w.read_answers()
        if lines is None:
            self.unwatch(w.stdout_fd)
            w.saw_eof(now)
            self.reap_all = True  # look for its exit status now
            return
        if lines:
            self.intake.take(w, lines, now)

    def _on_stderr(self, w: WorkerProcess, now: float) -> None:
        lines = w.read_stderr()
        if lines is None:
            self.unwatch(w.stderr_fd)
            if w.proc.stderr is not None:
                w.proc.stderr.close()
            w.stderr_fd = None
            return
        for line in lines:
            log.info("[%s %d] %s", w.stage, w.pid, line)

    # == spawning and placing ====================================================
    def _env(self, pool: StagePool) -> dict[str, str]:
        return worker_env(
            os.environ,
            pool.name,
            self.config.dsn,
            self.dispatcher_id,
            self.config.path,
            pool.config.worker_dsn or self.dispatch_config.worker_dsn,
        )

    def _forked(self, pool: StagePool, env: dict[str, str]) -> WorkerProcess | None:
        """A worker forked by the stage's template, or None (no template ready,
        or it failed: then it is ended and the caller execs)."""
        fork = pool.template_fork()
        if fork is None:
            return None
        program, config_file = pool.config.program, self.dispatch_config.config_file
        try:
            return WorkerProcess(pool.name, program, config_file, env, pool.generation, fork)
        except OSError as exc:
            pool.template_failed(exc)
            return None

    def _may_template(self) -> bool:
        """Templates need us to be a child subreaper (so forked workers become
        ours), and none starts while we stop."""
        if self._subreaper is None:
            self._subreaper = is_subreaper()
        return self._subreaper and not self.shutting_down

    def probe_templates(self, now: float) -> None:
        """Offer each new pool's template to a worker that is handed nothing and
        stopped at once (:meth:`StagePool.probe_wanted`), so that the first
        burst after a start or a reload forks its workers."""
        self.probes_pending = False
        if not self._may_template():
            return
        for pool in list(self.pools.values()):
            if not pool.probe_wanted(now):
                continue
            pool.probed = True
            w = self.spawn(pool, now, SpawnFor.PROBE)
            if w is not None:
                self.stop(w, now, "template probe, handed nothing")

    def start_template(self, pool: StagePool, w: WorkerProcess, now: float) -> None:
        """``w`` says its program can be a template: start one for its stage,
        unless the worker forked one itself (``StagePool.template_offer``)."""
        if not self._may_template():
            pool.template_tried = True
            return
        argv = worker_argv(pool.config.program, self.dispatch_config.config_file)
        pool.start_template(argv, self._env(pool), now)

    def spawn(
        self, pool: StagePool, now: float, purpose: SpawnFor = SpawnFor.MESSAGES
    ) -> WorkerProcess | None:
        """A new worker for ``pool`` (None: it cannot start; the stage cools down),
        started for ``purpose`` (:class:`SpawnFor`). A stage with a template forks
        it there, else execs PROGRAM."""
        env = self._env(pool)
        offer = None
        try:
            w = self._forked(pool, env)
            if w is None:
                offer = pool.template_offer(now) if self._may_template() else None
                w = WorkerProcess(
                    pool.name,
                    pool.config.program,
                    self.dispatch_config.config_file,
                    env,
                    pool.generation,
                    offer=offer,
                )
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            # OSError: not found / not executable / exec failed; ValueError: PROGRAM
            # does not split (unbalanced quotes); SubprocessError: the child set-up failed.
            # The exact cause (an interpreter, not the script, may be at fault).
            why = program_problem(pool.config.program) or exc
            pool.start_cooldown(
                now, f"cannot start PROGRAM {pool.config.program!r}: {why} (rows stay pending)"
            )
            return None
        if offer is not None:
            pool.offered_to = w.pid
        self.sentinel.watch(w.pid)  # its pid is its process group id
        w.group_killed = self.sentinel.forget
        pool.workers.append(w)
        if purpose is SpawnFor.SPARE:
            pool.spares.add(w.pid)
        elif purpose is SpawnFor.MESSAGES:
            # timed from now; a warm or probe worker's first answer would time its idle wait too
            pool.spawned_at[w.pid] = now
        self.sel.register(
            w.stdout_fd, selectors.EVENT_READ, self.on_ready(w, "answers", self._on_stdout)
        )
        self.sel.register(
            w.stderr_fd, selectors.EVENT_READ, self.on_ready(w, "stderr", self._on_stderr)
        )
        log.info(
            "stage %s: worker pid %d %s (%d/%d)%s",
            pool.name,
            w.pid,
            "forked by the stage's template" if w.forked else "started",
            pool.holders(),
            pool.parallelism,
            purpose.value.format(min_workers=pool.min_workers),
        )
        return w

    def spawn_warm(self, pool: StagePool, now: float) -> WorkerProcess | None:
        """A worker started to keep ``pool`` at MIN_WORKERS (workers/warm.py)."""
        return self.spawn(pool, now, SpawnFor.WARM)

    def spawn_spare(self, pool: StagePool, old: WorkerProcess, now: float) -> None:
        """A warm spare for ``old``, which nears MAX_MESSAGES: its replacement
        started now, handed nothing until ``old`` drains."""
        pool.heirs.add(old.pid)
        self.spawn(pool, now, SpawnFor.SPARE)

    def place(
        self,
        claimed: list[tuple[int, str]],
        now: float,
        spawn_now: Callable[[], float],
        lines: Mapping[int, str] | None = None,
    ) -> int:
        """Hand claimed ids to workers, one write per worker; release what finds
        no place. ``spawn_now`` reads the clock for a spawn; ``lines``: claimed
        rows as lines, by id, for the workers that take rows on their pipe.
        Returns ids handed out."""
        by_stage: dict[str, list[int]] = {}
        for message_id, stage in claimed:
            by_stage.setdefault(stage, []).append(message_id)
        debug = log.isEnabledFor(logging.DEBUG)
        handed = 0
        for stage, ids in by_stage.items():
            pool = self.pools.get(stage)
            if pool is None:
                self.ledger.unplaced(ids)
                continue
            assignments, unplaced = pool.place(ids, now, lambda p: self.spawn(p, spawn_now()))
            for w, batch in assignments:
                # An id may still sit unanswered at its previous stage's worker: that
                # stage committed the advance (the claim takes pending rows only) and
                # its answer is on the way. The new worker owns it now; the old answer
                # then leaves it alone. It may also be the same worker (the stage
                # advanced the row to itself): then `w` holds the id twice and only
                # its last answer lets go of it.
                self.ledger.hand(batch, w)
                w.give(batch, now, lines if lines and w.slot.takes_rows else None)
                if w.outbuf and w.stdin_fd is not None:
                    try:
                        self.sel.register(
                            w.stdin_fd,
                            selectors.EVENT_WRITE,
                            self.on_ready(w, "stdin", self._on_stdin),
                        )
                    except KeyError:
                        pass
                self.stats.handed_out(len(batch))
                handed += len(batch)
                if debug:
                    log.debug("stage %s pid %d: given %s", stage, w.pid, ids_text(batch))
            if unplaced:
                self.ledger.unplaced(unplaced)
        # A claim that filled capacity may have left more pending rows behind;
        # answers will free room and trigger the next claim.
        return handed

    # == stopping ================================================================
    def stop(self, w: WorkerProcess, now: float, why: str) -> None:
        """Ask an idle worker to go: EOF on stdin (it exits 0)."""
        self.unwatch(w.stdin_fd)
        w.stop(now + self.dispatch_config.shutdown_timeout, why)
        log.debug("stage %s worker pid %d: stopping (%s)", w.stage, w.pid, why)

    def kill(self, w: WorkerProcess) -> None:
        """SIGKILL ``w``; its remaining ids are released once it is reaped."""
        w.kill()
        self.reap_all = True  # reap it in this very iteration if it is gone already
        self.unwatch(w.stdin_fd)
        w.close_stdin()

    def retire_all(self, now: float) -> int:
        """A reload: every worker takes no new ids and goes once drained."""
        n = 0
        for w in self.all():
            if w.retire():
                n += 1
                if not w.inflight and not w.stopping:
                    self.stop(w, now, "reload")
        return n

    def terminate_all(self) -> int:
        """The dispatcher is stopping: SIGTERM to every worker; templates end."""
        self.shutting_down = True
        for pool in self.pools.values():
            pool.close_template()
        workers = self.all()
        for w in workers:
            w.terminate()
        return len(workers)

    def kill_all_now(self, now: float) -> None:
        """SHUTDOWN_TIMEOUT is over: SIGKILL whoever is left, reap and settle them."""
        for w in self.all():
            if not w.killed:
                log.warning(
                    "stage %s worker pid %d still running after SHUTDOWN_TIMEOUT; killing it",
                    w.stage,
                    w.pid,
                )
                self.kill(w)
        # Killed children go away in milliseconds; wait for them here so the
        # shutdown does not spin on the 10 ms reap timer.
        for w in self.all():
            rc = w.wait_dead()
            self._finalize(w, rc, now)

    def drop_all(self) -> int:
        """Declared dead (competing): kill and reap every worker, forget its ids
        (they are no longer ours). Returns how many ids they held."""
        workers = self.all()
        held = sum(len(w.inflight) + len(w.undelivered) for w in workers)
        for w in workers:
            w.wait_dead()  # SIGKILL to the group, then reap
            self._unwatch_all(w)
            w.close_fds()
            w.inflight.clear()
            w.undelivered.clear()
        for pool in self.pools.values():
            pool.workers.clear()
        self.leftover.clear()
        return held

    def abandon_all(self) -> None:
        """The lock is lost: kill and reap every worker; nothing is settled."""
        for pool in self.pools.values():
            pool.close_template()
        for w in self.all():
            w.wait_dead()
            w.close_fds()
        self.pools.clear()
        self.leftover.clear()

    # == reaping =================================================================
    def reap(self, now: float) -> None:
        """Collect exited workers; settle their unanswered ids (they are dead now)."""
        check_all = self.reap_all
        self.reap_all = False
        for _ in range(8):  # bounded; the next SIGCHLD comes back here anyway
            for w in self.all():
                if not (check_all or w.killed or w.eof):
                    continue
                rc = w.poll()
                if rc is None:
                    continue
                self._finalize(w, rc, now)
            if not check_all:
                return
            # As child subreaper: reap grandchildren that outlived their worker.
            reaped, worker_waiting = reap_orphans({w.pid for w in self.all()})
            for pid in reaped:
                if not self.sentinel.reaped(pid):
                    log.debug("reaped pid %d, an orphaned descendant of a worker", pid)
            if not worker_waiting:
                return

    def _finalize(self, w: WorkerProcess, rc: int, now: float) -> None:
        pool = self.pool_of(w)
        # Answers written before it exited (or timed out) may still sit in the pipe.
        if (not w.killed or w.overdue is not None) and w.stdout_fd is not None:
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
            self._on_stderr(w, now)  # last words, at most one chunk burst
        # Asked while its stdin is still open: FIONREAD tells if it read anything.
        started = w.has_read()
        self._unwatch_all(w)
        w.close_fds()
        if pool is not None:
            pool.workers.remove(w)
            pool.forget(w)
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
            db_connected=self.db_connected(),
            timed_out=w.overdue is not None,
        )
        where = str(self.config.path or "none loaded")
        n_undelivered = len(undelivered)
        stopping = self.shutting_down
        settle_exit(self.books, w, pool, kind, rc, ids, n_undelivered, now, stopping, where)
        w.slot.close()
        self.ledger.want_claim()


__all__ = ["SpawnFor", "Supervisor"]
