"""The dispatcher's periodic duties: small objects of one shape.

A duty says when it is next due (:meth:`Duty.next_due`, INF when it has
nothing to do) and does its work when asked (:meth:`Duty.run`). The loop's
select timeout is the minimum of its duties' next due times (and of the
workers' watchdogs), so what wakes the loop is exactly what is then done, and
nothing wakes it when nothing is due.

The duties (see docs/INTERNALS.md, "The loop's duties"):

- the heartbeat's: registration check, heartbeat, stage registration retry,
  orphan reset, purge -- each an :class:`Every`;
- the database round trip of a wake (claims, owed writes and the
  paused-row flip riding in it) -- :class:`.database.round_trip.RoundTrip`;
- the statistics flush -- :class:`.database.stats_flush.StatsFlush`;
- the warm workers of stages below MIN_WORKERS --
  :class:`.workers.warm.WarmWorkers` (run with the watchdogs by the supervisor).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from pepsi_dispatch.contract import INF


class Duty(Protocol):
    """One periodic duty of the dispatcher."""

    name: str

    def next_due(self, now: float) -> float:
        """Monotonic time at which the duty is next due; INF: nothing to do."""
        ...

    def run(self, now: float) -> None:
        """Do the duty (called when ``now >= next_due(now)``); may raise psycopg.Error."""
        ...


class Every:
    """A duty done every ``interval`` seconds by ``action(now)``, while ``active()``."""

    def __init__(
        self,
        name: str,
        interval: float,
        action: Callable[[float], None],
        active: Callable[[], bool] = lambda: True,
    ) -> None:
        self.name = name
        self.interval = interval
        self.action = action
        self.active = active
        #: when the duty is next due (0: at the first look).
        self.next_at = 0.0

    def next_due(self, now: float) -> float:
        return self.next_at if self.active() else INF

    def run(self, now: float) -> None:
        self.next_at = now + self.interval
        self.action(now)

    def start(self, now: float) -> None:
        """First due one interval after ``now``."""
        self.next_at = now + self.interval


def earliest(duties: Iterable[Duty], now: float) -> float:
    """The earliest next due time of ``duties`` (INF: none is due ever)."""
    return min((d.next_due(now) for d in duties), default=INF)


__all__ = ["Duty", "Every", "earliest"]
