"""Stages whose workers fail every message they get, reported at ERROR.

The workers' own explanations arrive as INFO lines of their stderr, easy to miss
among the rest. Once per interval (STATS_INTERVAL) the dispatcher logs one
ERROR line for each stage that failed messages and completed none.
"""

from __future__ import annotations

import logging

__all__ = ["FailureWatch"]

log = logging.getLogger("pepsi_dispatch.coordinator.dispatcher")


class FailureWatch:
    def __init__(self, interval: float, now: float) -> None:
        self.interval = max(interval, 1.0)
        self.next_report = now + self.interval
        self.succeeded: set[str] = set()
        self.failures: dict[str, int] = {}
        self.last_reason: dict[str, str] = {}

    def ok(self, stage: str) -> None:
        self.succeeded.add(stage)

    def failed(self, stage: str, reason: str) -> None:
        self.failures[stage] = self.failures.get(stage, 0) + 1
        self.last_reason[stage] = reason

    def check(self, now: float) -> None:
        """Report and start a new interval when the current one is over."""
        if now < self.next_report:
            return
        for stage, n in sorted(self.failures.items()):
            if stage not in self.succeeded:
                log.error(
                    "stage %s: all %d message(s) it finished in the last %.0f s failed;"
                    " last error: %s (the worker's stderr is in this log; see"
                    " 'pepsi-queue failed --stage %s')",
                    stage,
                    n,
                    self.interval,
                    self.last_reason.get(stage, "?")[:500],
                    stage,
                )
        self.succeeded.clear()
        self.failures.clear()
        self.last_reason.clear()
        self.next_report = now + self.interval
