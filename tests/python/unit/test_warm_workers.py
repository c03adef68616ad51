"""MIN_WORKERS: the pool's numbers, the idle watchdog keeping warm workers and
the top-up duty (no database, no processes: stand-in workers and spawns)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pepsi_dispatch.config import DispatchConfig
from pepsi_dispatch.config.model import StageConfig
from pepsi_dispatch.contract import INF
from pepsi_dispatch.coordinator.ledger import Ledger
from pepsi_dispatch.coordinator.stats import Stats
from pepsi_dispatch.coordinator.workers.stage_pool import StagePool
from pepsi_dispatch.coordinator.workers.warm import WarmWorkers
from pepsi_dispatch.coordinator.workers.watchdogs import Watchdogs


@dataclass
class _Worker:
    """What StagePool and the watchdog table read of a worker."""

    pid: int
    stage: str = "s"
    sent: int = 0
    answers_received: int = 0
    first_given: float = 0.0
    retiring: bool = False
    stopping: bool = False
    eof: bool = False
    killed: bool = False
    reading: bool = True
    stdin_fd: int | None = 3
    idle_since: float = 0.0
    head_since: float = 0.0
    eof_at: float = 0.0
    stop_deadline: float = 0.0
    inflight: deque[int] = field(default_factory=deque)

    def has_read(self) -> bool:
        return True


def _pool(parallelism: int = 3, min_workers: int = 2, paused: bool = False) -> StagePool:
    config = StageConfig(
        "s", "/bin/true", (), parallelism, 4, 1000, min_workers=min_workers, paused=paused
    )
    return StagePool(config, 1)


class _Spawner:
    """spawn(pool, now) as the supervisor does it: a worker appended to the pool."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.started: list[int] = []
        self.next_pid = 100

    def __call__(self, pool: StagePool, now: float) -> Any:
        if self.fail:
            pool.start_cooldown(now, "cannot start PROGRAM")
            return None
        self.next_pid += 1
        w = _Worker(self.next_pid, idle_since=now)
        pool.workers.append(w)  # type: ignore[arg-type]
        self.started.append(w.pid)
        return w


def _duty(
    pools: list[StagePool], spawn: _Spawner, serving: list[bool] | None = None
) -> WarmWorkers:
    flag = serving if serving is not None else [True]
    return WarmWorkers(lambda: pools, spawn, lambda: flag[0])


# -- the pool's numbers ----------------------------------------------------------------


def test_an_empty_pool_wants_min_workers_now() -> None:
    pool = _pool(parallelism=3, min_workers=2)
    assert pool.warm_wanted() == 2
    assert pool.warm_due(10.0) == 10.0


def test_min_workers_zero_wants_nothing_and_keeps_nothing() -> None:
    """The default: today's behaviour, on demand only."""
    pool = _pool(min_workers=0)
    w = _Worker(1)
    pool.workers.append(w)  # type: ignore[arg-type]
    assert pool.warm_wanted() == 0 and pool.warm_due(10.0) == INF
    assert not pool.keeps_idle(w)  # type: ignore[arg-type]


def test_workers_on_their_way_out_do_not_count() -> None:
    pool = _pool(parallelism=4, min_workers=2)
    pool.workers.extend(  # type: ignore[arg-type]
        [_Worker(1, stopping=True), _Worker(2, eof=True), _Worker(3, retiring=True), _Worker(4)]
    )
    assert pool.warm() == 1
    # the other three still hold their slots until reaped: 4 - 4 = no free slot
    assert pool.warm_wanted() == 0
    assert pool.warm_due(5.0) == INF
    pool.workers = pool.workers[1:]  # the stopped one is reaped: a slot frees up
    assert pool.warm_wanted() == 1


def test_warm_workers_never_exceed_parallelism() -> None:
    """A reload raised MIN_WORKERS to PARALLELISM while retiring workers still
    hold their slots: only the free slots are filled now, the rest after the reap."""
    pool = _pool(parallelism=2, min_workers=2)
    pool.workers.append(_Worker(1, retiring=True))  # type: ignore[arg-type]
    assert pool.warm_wanted() == 1


def test_a_warm_spare_counts_as_warm() -> None:
    """A spare started for a worker nearing MAX_MESSAGES is a live worker: no
    extra one is started next to it (at most one spare per stage stays)."""
    pool = _pool(parallelism=2, min_workers=2)
    old, other, spare = _Worker(1, stopping=True), _Worker(2), _Worker(3)
    pool.workers.extend([old, other, spare])  # type: ignore[arg-type]
    pool.spares.add(3)
    pool.recycled.add(1)
    assert pool.warm() == 2
    assert pool.warm_wanted() == 0


def test_a_worker_with_a_spare_started_for_it_is_replaced_by_the_spare() -> None:
    """A worker nearing MAX_MESSAGES whose spare is up no longer counts: the
    spare does. The others are kept, and it may go idle without a top-up."""
    pool = _pool(parallelism=2, min_workers=2)
    leaving, other, spare = _Worker(1), _Worker(2), _Worker(3)
    pool.workers.extend([leaving, other, spare])  # type: ignore[arg-type]
    pool.heirs.add(1)
    pool.spares.add(3)
    assert pool.warm() == 2 and pool.warm_wanted() == 0
    assert pool.keeps_idle(other) and pool.keeps_idle(spare)  # type: ignore[arg-type]
    assert not pool.keeps_idle(leaving)  # type: ignore[arg-type]


def test_a_paused_stage_keeps_no_warm_worker() -> None:
    pool = _pool(min_workers=2, paused=True)
    assert pool.min_workers == 0 and pool.warm_wanted() == 0
    w = _Worker(1)
    pool.workers.append(w)  # type: ignore[arg-type]
    assert not pool.keeps_idle(w)  # type: ignore[arg-type]


def test_keeps_idle_down_to_min_workers_only() -> None:
    pool = _pool(parallelism=3, min_workers=2)
    ws = [_Worker(1), _Worker(2), _Worker(3)]
    pool.workers.extend(ws)  # type: ignore[arg-type]
    assert not pool.keeps_idle(ws[2])  # type: ignore[arg-type]  # three: one may go
    ws[2].stopping = True
    assert pool.keeps_idle(ws[0]) and pool.keeps_idle(ws[1])  # type: ignore[arg-type]
    ws[0].retiring = True  # a reload: a retiring worker is never kept
    assert not pool.keeps_idle(ws[0])  # type: ignore[arg-type]


# -- the idle watchdog -----------------------------------------------------------------


@dataclass
class _Owner:
    """The watchdogs' WorkerControl: records stops."""

    pools: dict[str, StagePool]
    dispatch_config: DispatchConfig = field(
        default_factory=lambda: DispatchConfig(max_runtime=10.0, worker_idle_timeout=0.5)
    )
    ledger: Ledger = field(default_factory=Ledger)
    stats: Stats = field(default_factory=Stats)
    shutting_down: bool = False
    stopped: list[int] = field(default_factory=list)

    def all(self) -> list[Any]:
        return [w for p in self.pools.values() for w in p.workers]

    def pool_of(self, w: Any) -> Any:
        return self.pools.get(w.stage)

    def stop(self, w: Any, now: float, why: str) -> None:
        assert why == "idle"
        self.stopped.append(w.pid)
        w.stopping = True

    def kill(self, w: Any) -> None:
        raise AssertionError("no kill expected")


def test_idle_timeout_stops_down_to_min_workers_and_never_below() -> None:
    """Three idle workers, MIN_WORKERS 2: one stop at WORKER_IDLE_TIMEOUT, all
    three rows due in the same wake; the two left have no idle row at all, so
    the select timeout never spins on them."""
    pool = _pool(parallelism=3, min_workers=2)
    pool.workers.extend([_Worker(1), _Worker(2), _Worker(3)])  # type: ignore[arg-type]
    owner = _Owner({"s": pool})
    dogs = Watchdogs(owner)
    assert dogs.next_deadline(0.0) == 0.5
    dogs.fire_due(0.5)
    assert owner.stopped == [1]
    assert dogs.next_deadline(0.6) == INF
    for t in (1.0, 5.0, 100.0):
        dogs.fire_due(t)
    assert owner.stopped == [1]


def test_idle_timeout_stops_every_idle_worker_without_min_workers() -> None:
    pool = _pool(parallelism=3, min_workers=0)
    pool.workers.extend([_Worker(1), _Worker(2)])  # type: ignore[arg-type]
    owner = _Owner({"s": pool})
    Watchdogs(owner).fire_due(0.5)
    assert owner.stopped == [1, 2]


def test_a_paused_stage_goes_idle_as_before() -> None:
    pool = _pool(parallelism=3, min_workers=2, paused=True)
    pool.workers.extend([_Worker(1), _Worker(2)])  # type: ignore[arg-type]
    owner = _Owner({"s": pool})
    Watchdogs(owner).fire_due(0.5)
    assert owner.stopped == [1, 2]


# -- the top-up duty -------------------------------------------------------------------


def test_the_duty_starts_the_missing_workers_at_once() -> None:
    pool = _pool(parallelism=3, min_workers=2)
    spawn = _Spawner()
    duty = _duty([pool], spawn)
    assert duty.next_due(1.0) == 1.0
    duty.run(1.0)
    assert spawn.started == [101, 102]
    assert duty.next_due(1.0) == INF  # nothing missing: the loop does not spin
    duty.run(2.0)
    assert spawn.started == [101, 102]


def test_a_worker_that_goes_is_replaced() -> None:
    pool = _pool(parallelism=3, min_workers=2)
    spawn = _Spawner()
    duty = _duty([pool], spawn)
    duty.run(1.0)
    pool.workers.pop(0)  # reaped (recycled, crashed, killed)
    assert duty.next_due(3.0) == 3.0
    duty.run(3.0)
    assert spawn.started == [101, 102, 103] and pool.warm() == 2


def test_a_cooldown_holds_the_top_up_until_its_end() -> None:
    """A program that cannot start: one attempt, then the next at the
    cooldown's end (1 s, then 2 s, ...), never a fork loop."""
    pool = _pool(parallelism=3, min_workers=2)
    spawn = _Spawner(fail=True)
    duty = _duty([pool], spawn)
    duty.run(10.0)
    assert pool.cooldown_until == 11.0
    assert duty.next_due(10.5) == 11.0
    duty.run(10.5)  # not due: nothing tried
    spawn.fail = False
    duty.run(11.0)
    assert spawn.started == [101, 102]


def test_the_duty_respects_a_cooldown_started_by_a_dead_worker() -> None:
    pool = _pool(parallelism=3, min_workers=1)
    pool.start_cooldown(5.0, "worker pid 9 exited with code 1 before answering anything")
    spawn = _Spawner()
    duty = _duty([pool], spawn)
    assert duty.next_due(5.0) == 6.0
    duty.run(5.5)
    assert spawn.started == []
    duty.run(6.0)
    assert spawn.started == [101]


def test_nothing_is_started_while_the_dispatcher_stops() -> None:
    pool = _pool(parallelism=3, min_workers=2)
    spawn = _Spawner()
    serving = [False]
    duty = _duty([pool], spawn, serving)
    assert duty.next_due(1.0) == INF
    duty.run(1.0)
    assert spawn.started == []


def test_stages_without_min_workers_are_left_alone() -> None:
    on_demand, paused = _pool(min_workers=0), _pool(min_workers=2, paused=True)
    spawn = _Spawner()
    duty = _duty([on_demand, paused], spawn)
    assert duty.next_due(1.0) == INF
    duty.run(1.0)
    assert spawn.started == []
