"""The timer of the paused-row flip (``pepsi.requeue_due``).

Due paused rows flip to pending (or fail when their retries ran out, or
expire) in ``pepsi.requeue_due``, which rides in a wake's round trip next to
the claim. This module decides when that is due: at the earliest paused row's
due time (the function returns it), soon after answers came in (a stage may
have paused a row, and pausing does not notify), and not for a while after the
function itself failed on a poisoned row.
"""

from __future__ import annotations

import logging

from pepsi_dispatch.contract import INF
from pepsi_dispatch.coordinator.database.port import Requeue
from pepsi_dispatch.coordinator.ledger import Ledger
from pepsi_dispatch.coordinator.stats import Stats

log = logging.getLogger(__name__)

#: requeue_due runs at most this often because of answers (a stage may have
#: paused a row; pausing does not notify). A pause of 2 s is thus retried on
#: time: its due time is learned within a second of the pause.
AFTER_ANSWERS = 1.0
#: After requeue_due itself failed (a poisoned paused row): next try after this.
AFTER_ERROR = 10.0
#: Summaries at INFO at most this often.
LOG_EVERY = 60.0


class PausedFlip:
    """When ``pepsi.requeue_due`` is next due, and what its results mean."""

    def __init__(self, ledger: Ledger, stats: Stats) -> None:
        self.ledger = ledger
        self.stats = stats
        #: answers came in since the last flip (a stage may have paused a row).
        self.dirty = False
        #: the earliest paused row's due time (monotonic seconds), as last learned.
        self.at = 0.0
        self.last = -INF
        #: requeue_due itself failed (a poisoned paused row): not again before this.
        self.blocked_until = 0.0
        self._sums = [0, 0, 0]
        self._logged = -INF

    def due_now(self, now: float) -> None:
        """Look at the paused rows on the next wake (a delayed message, a reconnect)."""
        self.at = now

    def is_due(self, now: float) -> bool:
        """Is requeue_due to run now?"""
        return now >= self.blocked_until and (
            now >= self.at or (self.dirty and now - self.last >= AFTER_ANSWERS)
        )

    def deadline(self) -> float:
        """When requeue_due is next due (for the select timeout)."""
        t = max(self.at, self.blocked_until)
        if self.dirty:
            t = min(t, max(self.last + AFTER_ANSWERS, self.blocked_until))
        return t

    def failed(self, now: float) -> None:
        """requeue_due failed on its own: skip it for a while."""
        self.at = self.blocked_until = now + AFTER_ERROR

    def done(self, r: Requeue, now: float) -> None:
        """requeue_due ran: learn the next due time, count and log what it did."""
        self.last = now
        self.dirty = False
        if r.next_due_in is None:
            self.at = INF
        elif r.next_due_in <= 0:
            # More were due than one call moves: go again soon.
            self.at = now + (0.01 if r.requeued else 1.0)
        else:
            # +5 ms: wake just after the row is due, not just before.
            self.at = now + r.next_due_in + 0.005
        if r.requeued:
            self.ledger.forget_floors()  # requeued rows are pending again with their low ids
        if r.requeued or r.exhausted or r.expired:
            self.stats.requeued += r.requeued
            self.stats.expired += r.expired
            for stage, n in r.exhausted_by_stage:
                self.stats.exhausted(stage, n)
            self.ledger.want_claim()
            self._count(r, now)

    def _count(self, r: Requeue, now: float) -> None:
        # One INFO line per minute at most (the first one at once): a stage
        # that pauses a lot would otherwise log every second all hour.
        sums = self._sums
        sums[0] += r.requeued
        sums[1] += r.exhausted
        sums[2] += r.expired
        if now - self._logged >= LOG_EVERY:
            self.log_summary(now)
        else:
            log.debug(
                "paused rows due: %d requeued, %d exhausted, %d expired",
                r.requeued,
                r.exhausted,
                r.expired,
            )

    def log_summary(self, now: float) -> None:
        """The INFO line of what the flips did since the last one (if anything)."""
        sums = self._sums
        if any(sums):
            log.info(
                "paused rows due%s: %d requeued, %d failed (retries exhausted), %d expired",
                "" if self._logged == -INF else " since the last such line",
                *sums,
            )
        self._sums = [0, 0, 0]
        self._logged = now


__all__ = ["PausedFlip"]
