"""The supervisor's watchdogs as one table.

Every watchdog is one row (deadline, owner, action): a stage's spawn
cooldown ending, a worker hung in start-up, MAX_RUNTIME, a worker that
closed stdout but does not exit, a stop past SHUTDOWN_TIMEOUT, an idle
worker (unless its stage keeps it warm: MIN_WORKERS).
:meth:`Watchdogs.next_deadline` (the loop's select timeout) and
:meth:`Watchdogs.fire_due` (the timer phase) read the same table, so what
wakes the loop is exactly what is then done.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pepsi_dispatch.config import DispatchConfig
from pepsi_dispatch.contract import INF
from pepsi_dispatch.coordinator.ledger import Ledger
from pepsi_dispatch.coordinator.workers.process import Overdue, WorkerProcess
from pepsi_dispatch.coordinator.workers.stage_pool import StagePool

log = logging.getLogger(__name__)

#: A worker whose stdout reached EOF but which has not exited is SIGKILLed after this.
EOF_GRACE = 2.0
#: A worker must read its first input within max(MAX_RUNTIME, this) of being
#: given it, else it is killed as hung in start-up. Never less than 30 s: a
#: tight MAX_RUNTIME must not kill every worker of a slow-starting stage.
STARTUP_MIN = 30.0
#: How often a worker given ids is checked for its first read (WorkerProcess.has_read).
READ_POLL = 0.02
#: How soon a killed worker is looked for again (it is gone in milliseconds).
REAP_POLL = 0.01


@dataclass(slots=True)
class Watchdog:
    """One row of the watchdog table: at ``deadline``, ``action(owner, now)`` is due.
    ``owner`` is the worker (or pool) it is about: at most one action per owner
    and wake. A row without an action only wakes the loop (to look for a first
    read, or to reap a killed worker). The action is a method of
    :class:`Watchdogs` taking the owner, not a closure over it: the table is
    built twice per wake (select timeout, timer phase), so its rows are cheap."""

    deadline: float
    owner: Any
    action: Callable[[Any, float], None] | None


class WorkerControl(Protocol):
    """What the watchdogs need of the workers' owner (the supervisor): its
    pools and workers, the ledger, and stopping or killing one."""

    pools: dict[str, StagePool]
    ledger: Ledger
    dispatch_config: DispatchConfig
    shutting_down: bool

    def all(self) -> list[WorkerProcess]: ...

    def pool_of(self, w: WorkerProcess) -> StagePool | None: ...

    def stop(self, w: WorkerProcess, now: float, why: str) -> None: ...

    def kill(self, w: WorkerProcess) -> None: ...


class Watchdogs:
    """The watchdog table of a supervisor's workers and pools."""

    def __init__(self, sup: WorkerControl) -> None:
        self.sup = sup

    def table(self, now: float) -> list[Watchdog]:
        """The watchdog table, in the order its rows are checked.

        Per worker, the first due row in this order acts (one action per
        worker and wake): start-up, MAX_RUNTIME, EOF grace, stop deadline, idle.
        """
        rows: list[Watchdog] = []
        if not self.sup.shutting_down:
            for pool in self.sup.pools.values():
                if pool.cooldown_until:
                    rows.append(Watchdog(pool.cooldown_until, pool, self._cooled))
        max_runtime = self.sup.dispatch_config.max_runtime
        for w in self.sup.all():
            if w.killed:
                rows.append(Watchdog(now + REAP_POLL, w, None))  # reap soon
            elif w.inflight and not w.reading:
                # Not started yet: its first read is looked for on every wake (the
                # head's clock starts then), at least every READ_POLL.
                rows.append(Watchdog(now + READ_POLL, w, None))
                limit = max(max_runtime, STARTUP_MIN)
                rows.append(Watchdog(w.first_given + limit, w, self._hung))
            else:
                self._worker_rows(w, max_runtime, rows)
        return rows

    def _worker_rows(self, w: WorkerProcess, max_runtime: float, rows: list[Watchdog]) -> None:
        if w.inflight:
            rows.append(Watchdog(w.head_since + max_runtime, w, self._timeout))
        if w.eof:
            rows.append(Watchdog(w.eof_at + EOF_GRACE, w, self._eof_no_exit))
        if w.stopping and w.stop_deadline:
            rows.append(Watchdog(w.stop_deadline, w, self._stop_overdue))
        if not w.inflight and not w.stopping and not w.eof and not self._kept_warm(w):
            idle_at = w.idle_since + self.sup.dispatch_config.worker_idle_timeout
            rows.append(Watchdog(idle_at, w, self._idle))

    def _kept_warm(self, w: WorkerProcess) -> bool:
        """Is the idle ``w`` one of its stage's MIN_WORKERS (never stopped as idle)?"""
        pool = self.sup.pools.get(w.stage)
        return pool is not None and pool.keeps_idle(w)

    def next_deadline(self, now: float) -> float:
        """The earliest watchdog deadline (INF: none)."""
        return min((row.deadline for row in self.table(now)), default=INF)

    def fire_due(self, now: float) -> None:
        """Run the watchdog rows that are due, at most one per worker or pool.

        A worker seen reading its first input now starts its head's clock and
        is left alone for this wake.
        """
        acted: set[int] = set()
        for w in self.sup.all():
            if w.inflight and not w.reading and not w.killed and w.has_read():
                w.head_since = now
                acted.add(id(w))
        for row in self.table(now):
            if row.action is None or now < row.deadline or id(row.owner) in acted:
                continue
            if isinstance(row.owner, WorkerProcess) and row.owner.killed:
                continue
            acted.add(id(row.owner))
            row.action(row.owner, now)

    def _idle(self, w: WorkerProcess, now: float) -> None:
        # Idle rows due together: the first stops may have brought its stage to
        # MIN_WORKERS, and the rest are kept.
        if not self._kept_warm(w):
            self.sup.stop(w, now, why="idle")

    def _cooled(self, pool: StagePool, now: float) -> None:
        pool.cooldown_until = 0.0  # the delay is kept, so the next one grows
        self.sup.ledger.want_claim()
        log.info("stage %s: cooldown over, starting workers again", pool.name)

    def _hung(self, w: WorkerProcess, now: float) -> None:
        log.warning(
            "stage %s worker pid %d read none of its input within %g s"
            " of being started; killing it",
            w.stage,
            w.pid,
            max(self.sup.dispatch_config.max_runtime, STARTUP_MIN),
        )
        self.sup.kill(w)
        pool = self.sup.pool_of(w)
        if pool is not None:
            pool.start_cooldown(now, f"worker pid {w.pid} never started reading")

    def _timeout(self, w: WorkerProcess, now: float) -> None:
        """MAX_RUNTIME: kill ``w``. Which message times out is settled when it
        is reaped (exits.py), as a crash's blame is: the one its in-hand slot
        names, else this head of line; the others are answered if their
        answers are in the pipe, else released."""
        max_runtime = self.sup.dispatch_config.max_runtime
        head = w.inflight[0]
        seconds = now - w.head_since
        reason = f"timeout: no answer within MAX_RUNTIME ({max_runtime:g} s); worker killed"
        w.overdue = Overdue(head, seconds, reason)
        log.warning(
            "stage %s worker pid %d: message %d unanswered after %.1f s "
            "(MAX_RUNTIME); killing the worker",
            w.stage,
            w.pid,
            head,
            seconds,
        )
        self.sup.kill(w)

    def _eof_no_exit(self, w: WorkerProcess, now: float) -> None:
        log.warning(
            "stage %s worker pid %d closed stdout but did not exit; killing it", w.stage, w.pid
        )
        self.sup.kill(w)

    def _stop_overdue(self, w: WorkerProcess, now: float) -> None:
        log.warning(
            "stage %s worker pid %d did not exit within SHUTDOWN_TIMEOUT; killing it",
            w.stage,
            w.pid,
        )
        self.sup.kill(w)


__all__ = ["EOF_GRACE", "STARTUP_MIN", "Watchdog", "Watchdogs"]
