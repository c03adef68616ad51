"""The statistics flush: a duty of the dispatcher.

Statistics accumulate in memory (:mod:`pepsi_dispatch.coordinator.stats`) and
are flushed through ``pepsi.flush_stats`` in one transaction every
STATS_INTERVAL, when the pipeline goes idle (at most once a second), and at
shutdown; nothing is written when there are no deltas. Deltas are cleared only
after a flush went through, so a flush that fails because the database went
away loses nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psycopg

from pepsi_dispatch.contract import INF
from pepsi_dispatch.coordinator.database.isolation import Isolation
from pepsi_dispatch.coordinator.database.link import DatabaseLink, error_line
from pepsi_dispatch.coordinator.database.port import DispatchStore
from pepsi_dispatch.coordinator.stats import Stats

log = logging.getLogger(__name__)

#: Flush stats on going idle at most this often.
IDLE_FLUSH_MIN = 1.0


class StatsFlush:
    """Flushes the statistics when due; ``busy()`` says whether any worker works."""

    name = "statistics flush"

    def __init__(
        self,
        db: DispatchStore,
        link: DatabaseLink,
        stats: Stats,
        isolation: Isolation,
        interval: float,
        busy: Callable[[], bool],
        now: float,
        gauges: Callable[[float], tuple[int, dict[str, Any]] | None] | None = None,
    ) -> None:
        """``gauges(now)``: the dispatcher id and its gauges, written with each
        flush (without the deltas it flushes), so readers that add the gauges'
        unflushed deltas to the statistics see a counter that never jumps."""
        self.db = db
        self.link = link
        self.stats = stats
        self.isolation = isolation
        self.interval = interval
        self.busy = busy
        self.gauges = gauges
        #: when statistics were last flushed (moved only after a flush succeeded).
        self.last = now

    def next_due(self, now: float) -> float:
        """STATS_INTERVAL after the last flush, or a second after it when idle."""
        if not self.stats.pending():
            return INF
        t = self.last + self.interval
        return t if self.busy() else min(t, self.last + IDLE_FLUSH_MIN)

    def run(self, now: float, force: bool = False) -> None:
        """Flush if due (or ``force``); the deltas are cleared only after it went through."""
        if not self.stats.pending() or not (force or now >= self.next_due(now)):
            return
        try:
            current = self.gauges(now) if self.gauges is not None else None
            if current is None:
                self.db.flush_stats(self.stats.flush_args())
            else:
                did, values = current
                after = {**values, "unflushed": {"stages": {}, "dispatch": {}}}
                self.db.flush_stats(self.stats.flush_args(), (did, after))
        except psycopg.Error as exc:
            if not self.isolation.poisoned(exc):
                self.link.lost(now, exc)
                return
            # Deltas the database refuses would block every later flush (and,
            # through DatabaseLink.lost, all database work): drop them, loudly.
            log.error("statistics flush failed (%s); these deltas are dropped", error_line(exc))
        self.stats.clear()
        self.last = now


__all__ = ["StatsFlush"]
