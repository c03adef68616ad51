"""Settling the rows this dispatcher holds: after a reconnect, when the lock is
lost, and at the end of a run.

- After a reconnect, rows the database says we hold but no worker has (a claim
  that committed while its reply was lost) go back to pending.
- When the lock is lost, the owed writes and the statistics are sent, best
  effort (fenced by the dispatcher id, so they change only rows still ours).
- At the end, the owed writes are sent, every row still held is released, the
  statistics are flushed and the dispatcher unregisters.
"""

from __future__ import annotations

import logging

import psycopg

from pepsi_dispatch.coordinator.database.fence import Fence
from pepsi_dispatch.coordinator.database.link import error_line
from pepsi_dispatch.coordinator.database.port import (
    DispatchStore,
    RoundTripParams,
    RoundTripResult,
)
from pepsi_dispatch.coordinator.ledger import Ledger
from pepsi_dispatch.coordinator.stats import Stats

log = logging.getLogger(__name__)


def count_retried(stats: Stats, result: RoundTripResult) -> bool:
    """Failures record_dispatch_error paused for an automatic retry (RETRY_DELAY)
    are not failures in the statistics; True if there were any."""
    for _message_id, stage, status, reason in result.retried:
        stats.retried(stage, status, reason)
    return bool(result.retried)


class Settlement:
    """Sends what is owed and releases what is held, outside the wake's round trip."""

    def __init__(self, db: DispatchStore, fence: Fence, ledger: Ledger, stats: Stats) -> None:
        self.db = db
        self.fence = fence
        self.ledger = ledger
        self.stats = stats

    def strays(self) -> list[int]:
        """Rows the database says we hold but no worker has (after a reconnect).

        A claim that committed while its reply was lost with the connection
        left such rows running. Rows with an owed write are normally left for
        that write -- except a row owed an answer check that is no longer at
        the stage its answer was for (the last fused stage, if any): the stage
        advanced it, and the lost claim took it again. Its check would fail a
        healthy row for being "left running"; it is released instead (the
        last-fused-stage guard, docs/INTERNALS.md).
        """
        held = self.db.held(self.fence.id)
        checks = self.ledger.checks_to_verify(held)
        return self.ledger.strays(held, self.db.stages_of(checks) if checks else None)

    def release_strays(self) -> None:
        """After a reconnect: rows we hold that no worker has go back to pending
        (rows with an owed failure or answer check are left for those writes)."""
        stray = self.strays()
        if stray:
            self.db.release(self.fence.id, stray)
            log.info("released %d claimed row(s) no worker had", len(stray))

    def settle_fenced(self) -> None:
        """The lock is lost: send the owed writes about ids no worker holds and
        the stats (best effort). The writes are fenced by dispatcher_id, so they
        change only rows still held by this dispatcher."""
        if self.db.work_dead():
            return
        owed = self.ledger.owed()
        try:
            if owed.failures or owed.checks:
                writes = RoundTripParams(owed.failures, owed.checks)
                result = self.db.round_trip(self.fence.id, writes)
                count_retried(self.stats, result)
                self.ledger.sent_writes()
            self._flush()
        except psycopg.Error as exc:
            log.warning("could not settle owed writes and stats: %s", error_line(exc))

    def settle_at_exit(self) -> int:
        """All workers are gone: send the owed writes, release every row we
        hold, flush, unregister. Returns the rows released; raises psycopg.Error."""
        ledger = self.ledger
        if ledger.failures or ledger.checks:
            writes = RoundTripParams(ledger.failures, ledger.checks)
            result = self.db.round_trip(self.fence.id, writes)
            count_retried(self.stats, result)
            ledger.sent_writes()
        n = self.db.release(self.fence.id, None)
        ledger.released()
        self._flush()
        self.db.unregister(self.fence.id)
        return n

    def _flush(self) -> None:
        if self.stats.pending():
            self.db.flush_stats(self.stats.flush_args())
            self.stats.clear()


__all__ = ["Settlement", "count_retried"]
