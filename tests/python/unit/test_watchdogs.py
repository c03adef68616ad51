"""The workers' watchdog table, driven directly (no database, no processes).

A stand-in owner (the WorkerControl protocol) records what the watchdogs do;
stand-in workers carry only the fields the table reads.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from pepsi_dispatch.config import DispatchConfig
from pepsi_dispatch.contract import INF
from pepsi_dispatch.coordinator.ledger import Ledger
from pepsi_dispatch.coordinator.stats import Stats
from pepsi_dispatch.coordinator.workers.watchdogs import STARTUP_MIN, Watchdogs


def worker(**fields: Any) -> SimpleNamespace:
    base = dict(
        stage="a", pid=7, killed=False, reading=True, inflight=deque(), first_given=0.0,
        head_since=0.0, eof=False, eof_at=0.0, stopping=False, stop_deadline=0.0,
        idle_since=0.0, has_read=lambda: True,
    )  # fmt: skip
    base.update(fields)
    return SimpleNamespace(**base)


@dataclass
class Owner:
    """Records stops and kills; holds the pools, ledger and stats the table reads."""

    workers: list[SimpleNamespace]
    dispatch_config: DispatchConfig = field(
        default_factory=lambda: DispatchConfig(max_runtime=10.0, worker_idle_timeout=5.0)
    )
    pools: dict[str, Any] = field(default_factory=dict)
    ledger: Ledger = field(default_factory=Ledger)
    stats: Stats = field(default_factory=Stats)
    shutting_down: bool = False
    stopped: list[tuple[int, str]] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)

    def all(self) -> list[Any]:
        return self.workers

    def pool_of(self, w: Any) -> Any:
        return None

    def stop(self, w: Any, now: float, why: str) -> None:
        self.stopped.append((w.pid, why))
        w.stopping = True

    def kill(self, w: Any) -> None:
        self.killed.append(w.pid)
        w.killed = True


def test_an_idle_worker_is_stopped_at_worker_idle_timeout_not_before() -> None:
    owner = Owner([worker(idle_since=100.0)])
    dogs = Watchdogs(owner)
    assert dogs.next_deadline(100.0) == 105.0
    dogs.fire_due(104.9)
    assert owner.stopped == []
    dogs.fire_due(105.0)
    assert owner.stopped == [(7, "idle")]


def test_max_runtime_kills_only_that_worker_and_leaves_the_blame_to_its_reap() -> None:
    """The watchdog kills the worker and notes its overdue head; which message
    times out is settled once it is reaped, from its in-hand slot (exits.blame)."""
    busy = worker(pid=1, inflight=deque([41, 42]), head_since=100.0)
    calm = worker(pid=2, inflight=deque([43]), head_since=105.0)
    owner = Owner([busy, calm])
    owner.ledger.hand([41, 42], busy)
    owner.ledger.hand([43], calm)
    dogs = Watchdogs(owner)
    assert dogs.next_deadline(100.0) == 110.0
    dogs.fire_due(110.0)
    assert owner.killed == [1]
    assert (busy.overdue.head, busy.overdue.seconds) == (41, 10.0)
    assert "MAX_RUNTIME (10 s)" in busy.overdue.reason
    assert owner.ledger.failures == []  # settled when the killed worker is reaped
    assert list(busy.inflight) == [41, 42]
    assert not hasattr(calm, "overdue")


def test_a_worker_that_never_reads_is_killed_after_the_startup_limit() -> None:
    hung = worker(inflight=deque([5]), reading=False, first_given=0.0, has_read=lambda: False)
    owner = Owner([hung])
    dogs = Watchdogs(owner)
    limit = max(owner.dispatch_config.max_runtime, STARTUP_MIN)
    dogs.fire_due(limit - 0.1)
    assert owner.killed == []
    dogs.fire_due(limit)
    assert owner.killed == [7]


def test_a_first_read_starts_the_heads_clock_instead() -> None:
    w = worker(inflight=deque([5]), reading=False, head_since=0.0, has_read=lambda: True)
    owner = Owner([w])
    Watchdogs(owner).fire_due(50.0)
    assert owner.killed == [] and w.head_since == 50.0


def test_one_action_per_worker_and_wake() -> None:
    """Past MAX_RUNTIME and past its EOF grace: only the first row in table order acts."""
    w = worker(inflight=deque([9]), head_since=0.0, eof=True, eof_at=0.0)
    owner = Owner([w])
    owner.ledger.hand([9], w)
    Watchdogs(owner).fire_due(1000.0)
    assert owner.killed == [7] and w.overdue.head == 9


def test_no_worker_no_deadline() -> None:
    assert Watchdogs(Owner([])).next_deadline(0.0) == INF
