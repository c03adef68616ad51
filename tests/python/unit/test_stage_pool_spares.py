"""Warm spares at MAX_MESSAGES: at most one per stage (no database, no processes)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pepsi_dispatch.config.model import StageConfig
from pepsi_dispatch.coordinator.workers.stage_pool import StagePool


@dataclass
class _Worker:
    """What StagePool reads of a worker."""

    pid: int
    sent: int = 0
    answers_received: int = 0
    first_given: float = 1.0
    retiring: bool = False
    stopping: bool = False
    eof: bool = False
    stdin_fd: int | None = 3
    inflight: list[int] = field(default_factory=list)


def _pool(parallelism: int = 4, max_messages: int = 20) -> StagePool:
    config = StageConfig("s", "/bin/true", (), parallelism, 4, max_messages)
    return StagePool(config, 1)


def test_at_most_one_warm_spare_per_stage() -> None:
    """Four workers reach MAX_MESSAGES together: only the first gets a spare
    while it waits; once it took a slot, the next may get one. Before, every
    worker got its own (up to 2 x PARALLELISM processes)."""
    pool = _pool()
    workers = [_Worker(pid, sent=20, answers_received=18) for pid in (1, 2, 3, 4)]
    pool.workers.extend(workers)  # type: ignore[arg-type]
    assert pool.wants_spare(workers[0], 5.0)  # type: ignore[arg-type]
    pool.heirs.add(1)
    spare = _Worker(5)
    pool.workers.append(spare)  # type: ignore[arg-type]
    pool.spares.add(5)
    assert not any(pool.wants_spare(w, 5.0) for w in workers)  # type: ignore[arg-type]
    assert pool.holders() == 4
    # the first drains and gives its slot up; the spare takes it
    pool.recycled.add(1)
    assert pool._promote() is spare
    assert pool.wants_spare(workers[1], 5.0)  # type: ignore[arg-type]
