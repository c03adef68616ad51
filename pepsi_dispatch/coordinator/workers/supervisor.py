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
from collections.abc import Callable

from pepsi_dispatch.config import Config, DispatchConfig
from pepsi_dispatch.coordinator.checks import program_problem
from pepsi_dispatch.coordinator.failwatch import FailureWatch
from pepsi_dispatch.coordinator.ledger import Ledger, ids_text
from pepsi_dispatch.coordinator.stats import Stats
from pepsi_dispatch.coordinator.workers.answers import (
    FAILED,
    OK,
    PROTOCOL_ERROR,
    Answer,
    parse_answer,
)
from pepsi_dispatch.coordinator.workers.exits import ExitBooks, settle_exit
from pepsi_dispatch.coordinator.workers.process import WorkerProcess, classify_exit, reap_orphans
from pepsi_dispatch.coordinator.workers.sentinel import GroupSentinel
from pepsi_dispatch.coordinator.workers.stage_pool import StagePool, worker_env
from pepsi_dispatch.coordinator.workers.watchdogs import Watchdogs

log = logging.getLogger(__name__)


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
        #: kills the workers' groups if the dispatcher dies (started by the loop).
        self.sentinel = GroupSentinel()

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

    def capacity(self, now: float) -> tuple[list[str], list[int]]:
        """Stages with room now and how many ids each can take (the claim)."""
        stages: list[str] = []
        caps: list[int] = []
        for name, pool in self.pools.items():
            cap = pool.capacity(now)
            if cap > 0:
                stages.append(name)
                caps.append(cap)
        return stages, caps

    def has_room(self, now: float) -> bool:
        return any(p.capacity(now) > 0 for p in self.pools.values())

    def max_retries(self) -> dict[str, int]:
        """Each configured stage's MAX_RETRIES (for the paused-row flip)."""
        return {name: pool.config.max_retries for name, pool in self.pools.items()}

    def hold_off(self, stage: str, now: float, why: str) -> None:
        """Claim nothing for ``stage`` for a while (its cooldown), saying ``why``."""
        pool = self.pools.get(stage)
        if pool is not None:
            pool.start_cooldown(now, why)

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
            self._answers(w, lines, now)

    def _answers(self, w: WorkerProcess, lines: list[bytes], now: float) -> None:
        """Process answer lines of ``w`` in order (docs/WORKERS.md, the answers)."""
        if w.killed:
            return  # its in-flight list is being torn down; answers no longer map to ids
        w.reading = True
        pool = self.pool_of(w)
        debug = log.isEnabledFor(logging.DEBUG)
        inflight = w.inflight
        if not debug and len(lines) <= len(inflight) and lines.count(b"0") == len(lines):
            self._all_ok(w, len(lines), now)  # the hot path, batched
            lines = []
        for line in lines:
            if not inflight:
                log.warning(
                    "stage %s worker pid %d: answer %r with no message in flight "
                    "(protocol error); stopping it",
                    w.stage,
                    w.pid,
                    line[:200],
                )
                self.kill(w)
                break
            message_id = inflight.popleft()
            # (Still in ``inflight``: the stage let go of the row -- advanced it to
            # itself, or paused it and it was requeued -- and it was claimed and
            # handed to this same worker again. That second copy is still ours.)
            self.ledger.let_go(message_id, w, message_id in inflight)
            seconds = now - w.head_since
            w.head_since = now
            w.answers_received += 1
            if line == b"0":  # the hot path
                self.ledger.answered(message_id, w.stage)
                self.failwatch.succeeded.add(w.stage)
                self.stats.succeeded(w.stage, seconds)
                if debug:
                    log.debug(
                        "stage %s pid %d: %d done (%.3f s)", w.stage, w.pid, message_id, seconds
                    )
                continue
            if not self._answer(w, pool, message_id, line, seconds, now):
                break
        self._answered(w, pool, now)

    def _all_ok(self, w: WorkerProcess, n: int, now: float) -> None:
        """The next ``n`` answers of ``w`` are all a bare ``0``: what the loop in
        :meth:`_answers` does for each, once per batch (2-3x less CPU per
        answer; docs/BENCHMARKS.md). The first answer's service time counts
        from the head's hand-out, the others' from it (0 s), as one by one."""
        inflight = w.inflight
        ids = [inflight.popleft() for _ in range(n)]
        # An id still in ``inflight`` (or later in this batch) is a second copy,
        # still ours: walk backwards, so ``later`` is what follows each id.
        later = set(inflight)
        let_go, answered, stage = self.ledger.let_go, self.ledger.answered, w.stage
        for message_id in reversed(ids):
            let_go(message_id, w, message_id in later)
            later.add(message_id)
        for message_id in ids:
            answered(message_id, stage)
        seconds = now - w.head_since
        w.head_since = now
        w.answers_received += n
        self.failwatch.succeeded.add(stage)
        self.stats.succeeded_many(stage, seconds, n)

    def _answered(self, w: WorkerProcess, pool: StagePool | None, now: float) -> None:
        """After a batch of answers: the stage works, a warm spare may be due,
        room may have freed, and a drained worker may go."""
        if pool is not None and not w.killed:
            pool.success()
            pool.answered(w, now)
            if pool.wants_spare(w, now):
                self._spawn_spare(pool, w, now)
        self.on_answers()
        self.ledger.want_claim()
        if not w.inflight and not w.killed:
            w.idle_since = now
            if not w.stopping:
                if w.retiring:
                    self.stop(w, now, "retired by a reload")
                elif pool is not None and w.sent >= pool.max_messages:
                    # Recycled once drained: it gives its slot up now, to its warm
                    # spare if one was started (else a replacement spawns on demand).
                    self.stop(w, now, f"MAX_MESSAGES ({pool.max_messages}) reached")
                    pool.recycled.add(w.pid)

    def _answer(
        self,
        w: WorkerProcess,
        pool: StagePool | None,
        message_id: int,
        line: bytes,
        seconds: float,
        now: float,
    ) -> bool:
        """One answer other than a bare ``0``; False if it ended the worker."""
        try:
            answer = parse_answer(line)
        except Exception as exc:  # noqa: BLE001 - a bug here must cost one worker only
            log.exception("stage %s worker pid %d: cannot classify an answer", w.stage, w.pid)
            answer = Answer(PROTOCOL_ERROR, f"unreadable answer ({type(exc).__name__})")
        debug = log.isEnabledFor(logging.DEBUG)
        if answer.kind == OK:
            fused = self._fused_allowed(w, answer.fused)
            self.ledger.answered(message_id, fused[-1] if fused else w.stage)
            self.failwatch.ok(w.stage)
            self.stats.succeeded(w.stage, seconds, fused)
            if debug:
                log.debug("stage %s pid %d: %d %s", w.stage, w.pid, message_id, answer.text)
            return True
        if answer.kind == FAILED:
            self.ledger.failed(message_id, "failed", answer.text)
            self.failwatch.failed(w.stage, answer.text)
            self.stats.failed(w.stage, seconds)
            if debug:
                log.debug("stage %s pid %d: %d failed: %s", w.stage, w.pid, message_id, answer.text)
            return True
        self.ledger.failed(message_id, "failed", f'protocol error: worker answered "{answer.text}"')
        self.stats.failed(w.stage, seconds)
        log.warning(
            "stage %s worker pid %d: protocol error on message %d: %r; stopping it",
            w.stage,
            w.pid,
            message_id,
            answer.text[:200],
        )
        self.kill(w)
        if pool is not None and w.answers_received == 1:
            # Garbage as its very first answer (a banner on stdout, a wrong
            # PROGRAM): without a pause each replacement would fail the
            # next message at once.
            pool.start_cooldown(now, f"worker pid {w.pid}'s first answer was garbage")
        return False

    def _fused_allowed(self, w: WorkerProcess, fused: tuple[str, ...]) -> tuple[str, ...]:
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
    def spawn(self, pool: StagePool, now: float, spare: bool = False) -> WorkerProcess | None:
        """A new worker for ``pool`` (None: it cannot start; the stage cools down).
        A ``spare`` is started warm for a worker nearing MAX_MESSAGES."""
        env = worker_env(
            os.environ,
            pool.name,
            self.config.dsn,
            self.dispatcher_id,
            self.config.path,
            pool.config.worker_dsn or self.dispatch_config.worker_dsn,
        )
        try:
            w = WorkerProcess(
                pool.name,
                pool.config.program,
                self.dispatch_config.config_file,
                env,
                pool.generation,
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
        self.sentinel.watch(w.pid)  # its pid is its process group id
        w.group_killed = self.sentinel.forget
        pool.workers.append(w)
        if spare:
            pool.spares.add(w.pid)
        else:
            pool.spawned_at[w.pid] = now
        self.sel.register(
            w.stdout_fd, selectors.EVENT_READ, self.on_ready(w, "answers", self._on_stdout)
        )
        self.sel.register(
            w.stderr_fd, selectors.EVENT_READ, self.on_ready(w, "stderr", self._on_stderr)
        )
        log.info(
            "stage %s: worker pid %d started (%d/%d)%s",
            pool.name,
            w.pid,
            pool.holders(),
            pool.parallelism,
            " as a warm spare (MAX_MESSAGES recycle)" if spare else "",
        )
        return w

    def _spawn_spare(self, pool: StagePool, old: WorkerProcess, now: float) -> None:
        """Start ``old``'s replacement now, handed nothing until ``old`` drains."""
        pool.heirs.add(old.pid)
        self.spawn(pool, now, spare=True)

    def place(
        self, claimed: list[tuple[int, str]], now: float, spawn_now: Callable[[], float]
    ) -> int:
        """Hand claimed ids to workers, one write per worker; release what finds
        no place. ``spawn_now`` reads the clock for a spawn. Returns ids handed out."""
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
                w.give(batch, now)
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
        """The dispatcher is stopping: SIGTERM to every worker."""
        self.shutting_down = True
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
        )
        where = str(self.config.path or "none loaded")
        n_undelivered = len(undelivered)
        stopping = self.shutting_down
        settle_exit(self.books, w, pool, kind, rc, ids, n_undelivered, now, stopping, where)
        w.slot.close()
        self.ledger.want_claim()


__all__ = ["Supervisor"]
