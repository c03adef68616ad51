"""One poisoned row or stage stops only itself.

A wake's round trip is one pipeline: all or nothing. When it fails with both
connections intact (a data error, a limit, a raising trigger), one bad row or
stage may be poisoning the whole round trip. :meth:`Isolation.isolate` then
runs its parts one statement at a time: rows whose write keeps failing are
failed with a short dispatch_error saying why, a failing requeue_due is skipped
for a while, and a stage whose claim fails is reported so the loop holds it
off. Everything else goes through.
"""

from __future__ import annotations

import logging

import psycopg

from pepsi_dispatch.coordinator.database.fence import Fence
from pepsi_dispatch.coordinator.database.flip import AFTER_ERROR, PausedFlip
from pepsi_dispatch.coordinator.database.link import DatabaseLink, error_line
from pepsi_dispatch.coordinator.database.port import (
    CONNECTION_LOST,
    ClaimParams,
    DispatchStore,
    Failure,
    Requeue,
    RequeueParams,
    RoundTripResult,
)

log = logging.getLogger(__name__)


class Isolation:
    """Runs a failed round trip's parts one by one (see the module's text)."""

    def __init__(
        self, db: DispatchStore, link: DatabaseLink, fence: Fence, flip: PausedFlip
    ) -> None:
        self.db = db
        self.link = link
        self.fence = fence
        self.flip = flip

    def poisoned(self, exc: psycopg.Error) -> bool:
        """Did a statement fail for what it was given, the connections being fine?

        Lost connections, timeouts and cancels (OperationalError) are the
        database's trouble, handled by DatabaseLink.lost; anything else with both
        connections intact (a data error, a limit, a raising trigger) may be
        one bad row or stage poisoning the shared round trip.
        """
        if isinstance(exc, CONNECTION_LOST):
            return False
        return not (self.db.work_dead() or self.db.listen_dead())

    def isolate(
        self,
        now: float,
        exc: psycopg.Error,
        failures: list[Failure],
        answered: list[int],
        requeue: RequeueParams | None,
        claim: ClaimParams | None,
        claim_failed: list[str],
    ) -> RoundTripResult | None:
        """The round trip failed with the connections intact: run its parts one
        statement at a time. Stages whose claim failed alone are appended to
        ``claim_failed``. None if the connection broke meanwhile (then
        DatabaseLink.lost has run; the owed writes are kept and are idempotent,
        fenced by dispatcher id)."""
        log.error("database round trip failed (%s); running its parts one by one", error_line(exc))
        result = RoundTripResult([], None, [])
        try:
            if failures:
                self._record_errors_alone(failures)
            if answered:
                result.left_running = self._check_answered_alone(answered)
            if requeue is not None:
                result.requeue = self._requeue_alone(now, requeue)
            if claim is not None:
                result.claimed, result.off_floor = self._claim_by_stage(claim, claim_failed)
        except psycopg.Error as lost:
            self.link.lost(now, lost)
            return None
        return result

    def _record_errors_alone(self, failures: list[Failure]) -> None:
        try:
            self.db.record_errors(self.fence.id, failures)
            return
        except psycopg.Error as exc:
            if not self.poisoned(exc):
                raise
        for e in failures:
            try:
                self.db.record_errors(self.fence.id, [e])
            except psycopg.Error as exc:
                if not self.poisoned(exc):
                    raise
                self._fail_poisoned(e[0], f"its {e[1]} could not be recorded", exc)

    def _check_answered_alone(self, answered: list[int]) -> list[tuple[int, str]]:
        try:
            return self.db.check_answered(self.fence.id, answered)
        except psycopg.Error as exc:
            if not self.poisoned(exc):
                raise
        out: list[tuple[int, str]] = []
        for message_id in answered:
            try:
                out.extend(self.db.check_answered(self.fence.id, [message_id]))
            except psycopg.Error as exc:
                if not self.poisoned(exc):
                    raise
                self._fail_poisoned(message_id, "checking its answer 0 failed", exc)
        return out

    def _fail_poisoned(self, message_id: int, what: str, exc: psycopg.Error) -> None:
        """Take a row whose write keeps failing out of the way: fail it with a
        short dispatch_error saying why (log ERROR). Raises on a lost connection."""
        reason = f"dispatch error: {what}: {error_line(exc)[:300]}"
        log.error("message %d: %s; failing it", message_id, reason.removeprefix("dispatch error: "))
        try:
            self.db.record_errors(self.fence.id, [(message_id, "failed", reason)])
        except psycopg.Error as again:
            if not self.poisoned(again):
                raise
            log.error(
                "message %d: cannot fail it either (%s); it stays running, held by this"
                " dispatcher, until a restart resets it",
                message_id,
                error_line(again),
            )

    def _requeue_alone(self, now: float, requeue: RequeueParams) -> Requeue | None:
        try:
            return self.db.requeue_due(requeue)
        except psycopg.Error as exc:
            if not self.poisoned(exc):
                raise
            log.error(
                "requeue_due failed (%s); paused rows are not requeued, next try in %g s",
                error_line(exc),
                AFTER_ERROR,
            )
            self.flip.failed(now)
            return None

    def _claim_by_stage(
        self, claim: ClaimParams, claim_failed: list[str]
    ) -> tuple[list[tuple[int, str]], list[int]]:
        """(id, stage) of the rows claimed, and the ids among them of priority not 0."""
        stages, caps, after_ids, _ = claim
        try:
            # (no lines when isolating: the ids are handed bare)
            claimed, off_floor, _ = self.db.claim(
                self.fence.id, ClaimParams(stages, caps, after_ids)
            )
            return claimed, off_floor
        except psycopg.Error as exc:
            if not self.poisoned(exc):
                raise
        out: list[tuple[int, str]] = []
        off_floor: list[int] = []
        for i, stage in enumerate(stages):
            after = None if after_ids is None else [after_ids[i]]
            try:
                one = ClaimParams([stage], [caps[i]], after)
                claimed, off, _ = self.db.claim(self.fence.id, one)
                out.extend(claimed)
                off_floor.extend(off)
            except psycopg.Error as exc:
                if not self.poisoned(exc):
                    raise
                log.error("stage %s: claim failed: %s", stage, error_line(exc))
                claim_failed.append(stage)
        return out, off_floor


__all__ = ["Isolation"]
