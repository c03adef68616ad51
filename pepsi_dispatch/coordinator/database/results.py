"""What the dispatcher's statements return, decoded: the round trip's result,
``pepsi.requeue_due``'s counts, the claimed rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Requeue:
    """Result of ``pepsi.requeue_due``: counts and seconds until the next due row.

    ``exhausted_by_stage`` / ``expired_by_stage``: (stage, count) pairs, the
    per-stage split of ``exhausted`` / ``expired`` (requeue_due v2).
    """

    requeued: int
    exhausted: int
    expired: int
    next_due_in: float | None
    exhausted_by_stage: tuple[tuple[str, int], ...] = ()
    expired_by_stage: tuple[tuple[str, int], ...] = ()


@dataclass(slots=True)
class RoundTripResult:
    """What one :meth:`Database.round_trip` pipeline returned."""

    left_running: list[tuple[int, str]]
    requeue: Requeue | None
    claimed: list[tuple[int, str]]
    #: claimed ids of priority != 0: claim floors bound priority-0 rows only.
    off_floor: list[int] = field(default_factory=list)
    #: claimed rows as workers' lines (``pepsi.claim_lines``), by id; an id
    #: without one is handed as the bare id.
    lines: dict[int, str] = field(default_factory=dict)
    #: failures record_dispatch_error paused for an automatic retry instead of
    #: failing: (id, stage, status, reason) of the ``failures`` entries it retried.
    retried: list[tuple[int, str, str, str]] = field(default_factory=list)


def claimed_rows(cur: Any) -> tuple[list[tuple[int, str]], list[int], dict[int, str]]:
    """Claim rows (id, stage, priority[, line]) -> (id, stage) pairs, ids of
    priority not 0 (a schema before claim v5 returns no priority: all are 0),
    and the lines by id (``pepsi.claim_lines``; none from ``pepsi.claim``)."""
    rows = cur.fetchall()
    return (
        [(r[0], r[1]) for r in rows],
        [r[0] for r in rows if len(r) > 2 and r[2]],
        {r[0]: r[3] for r in rows if len(r) > 3 and r[3] is not None},
    )


def requeue_row(row: Any) -> Requeue:
    if row is None:
        return Requeue(0, 0, 0, None)
    return Requeue(
        int(row[0] or 0),
        int(row[1] or 0),
        int(row[2] or 0),
        seconds(row[3]),
        pairs(row[4], row[5]),
        pairs(row[6], row[7]),
    )


def pairs(stages: Any, counts: Any) -> tuple[tuple[str, int], ...]:
    return tuple((s, int(n)) for s, n in zip(stages or (), counts or (), strict=True) if n)


def seconds(value: Any) -> float | None:
    return None if value is None else value.total_seconds()


__all__ = ["Requeue", "RoundTripResult", "claimed_rows", "requeue_row"]
