"""MIN_WORKERS: each stage's warm workers, started before any message arrives.

:class:`WarmWorkers` is one of the loop's duties (coordinator/duties.py shape:
``name``, ``next_due``, ``run``). It is due when a stage has fewer live workers
than its MIN_WORKERS and a PARALLELISM slot is free: at the dispatcher's start,
after a reload that adds the stage or raises the value, and when a worker goes
(recycled at MAX_MESSAGES, crashed, killed). During a stage's spawn cooldown it
is due at the cooldown's end, so a program that cannot start is retried at the
cooldown's pace (1 s doubling to 60 s), never in a loop. A PAUSED stage keeps
no warm worker, and while the dispatcher stops nothing is started.

What WORKER_IDLE_TIMEOUT leaves running is decided where the idle watchdog is
(workers/watchdogs.py, through :meth:`StagePool.keeps_idle`); the numbers are
the pool's (:meth:`StagePool.warm_wanted`, :meth:`StagePool.warm_due`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pepsi_dispatch.contract import INF
from pepsi_dispatch.coordinator.workers.process import WorkerProcess
from pepsi_dispatch.coordinator.workers.stage_pool import StagePool


class WarmWorkers:
    """Keeps every stage at its MIN_WORKERS (a duty of the loop)."""

    name = "warm workers"

    def __init__(
        self,
        pools: Callable[[], Iterable[StagePool]],
        spawn: Callable[[StagePool, float], WorkerProcess | None],
        serving: Callable[[], bool],
    ) -> None:
        """``pools``: the current stages' pools (not those of removed stages);
        ``spawn(pool, now)``: start one worker that holds a slot (None: it could
        not start, and the pool is cooling down); ``serving``: False once the
        dispatcher stops."""
        self.pools = pools
        self.spawn = spawn
        self.serving = serving

    def next_due(self, now: float) -> float:
        """``now`` while a stage misses a warm worker it may start; a cooldown's
        end while one is held off; INF when nothing is missing."""
        if not self.serving():
            return INF
        return min((pool.warm_due(now) for pool in self.pools()), default=INF)

    def run(self, now: float) -> None:
        """Start the missing warm workers of every stage not cooling down."""
        if not self.serving():
            return
        for pool in list(self.pools()):
            if now < pool.cooldown_until:
                continue
            for _ in range(pool.warm_wanted()):
                if self.spawn(pool, now) is None:
                    break  # it cannot start: the pool cools down


__all__ = ["WarmWorkers"]
