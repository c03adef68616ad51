"""The database work of one wake: planned once, sent in one pipeline.

:meth:`Pipeline.plan` says what is due now -- the owed writes (releases
first, in their own statement, then failures and answer checks), a requeue
of due paused rows, ONE claim for every stage with room. The loop's select
timeout asks :meth:`Pipeline.due` instead, which repeats the plan's conditions
without building the plan (a unit test keeps the two in agreement).
:meth:`Pipeline.run` sends the plan; when the round trip fails with the
connections intact, its parts are run one statement at a time so that a
poisoned row or stage stops only itself (:meth:`Pipeline.isolate`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import psycopg

from pepsi_dispatch.config import DispatchConfig
from pepsi_dispatch.contract import INF
from pepsi_dispatch.coordinator.database.calls import (
    CONNECTION_LOST,
    Database,
    IterationResult,
    Requeue,
)
from pepsi_dispatch.coordinator.database.link import DatabaseLink, error_line
from pepsi_dispatch.coordinator.ledger import Ledger, OwedWrites, ids_text
from pepsi_dispatch.coordinator.stats import Stats

log = logging.getLogger(__name__)

#: requeue_due runs at most this often because of answers (a stage may have
#: paused a row; pausing does not notify). A pause of 2 s is thus retried on
#: time: its due time is learned within a second of the pause.
REQUEUE_AFTER_ANSWERS = 1.0
#: After requeue_due itself failed (a poisoned paused row): next try after this.
REQUEUE_RETRY_AFTER_ERROR = 10.0
#: Requeue summaries at INFO at most this often.
REQUEUE_LOG_EVERY = 60.0
#: Flush stats on going idle at most this often.
IDLE_FLUSH_MIN = 1.0

RequeueArgs = tuple[list[str], list[int], int, float | None]
ClaimArgs = tuple[list[str], list[int], list[int | None] | None]


@dataclass
class Plan:
    """The database work of one wake; empty (false) when nothing is due."""

    owed: OwedWrites
    requeue: RequeueArgs | None = None
    claim: ClaimArgs | None = None

    def __bool__(self) -> bool:
        return bool(self.owed) or self.requeue is not None or self.claim is not None


class StageRoom(Protocol):
    """What the wake needs to know of the workers' side: how many ids each
    stage can take now, and whether any worker is busy. The loop passes the
    supervisor; the database side never imports it."""

    def capacity(self, now: float) -> tuple[list[str], list[int]]: ...

    def has_room(self, now: float) -> bool: ...

    def busy(self) -> bool: ...

    def max_retries(self) -> dict[str, int]: ...


@dataclass
class WakeFacts:
    """What one wake's round trip found, for the loop to route to the workers'
    side: rows claimed (to be placed on workers) and stages whose claim failed
    on its own (to be held off)."""

    claimed: list[tuple[int, str]] = field(default_factory=list)
    claim_failed: list[str] = field(default_factory=list)


class Pipeline:
    """Plans and sends the per-wake round trip; owns the requeue schedule."""

    def __init__(
        self,
        dispatch_config: DispatchConfig,
        db: Database,
        link: DatabaseLink,
        ledger: Ledger,
        workers: StageRoom,
        stats: Stats,
        clock: Callable[[], float],
    ) -> None:
        self.dispatch_config = dispatch_config
        self.db = db
        self.link = link
        self.ledger = ledger
        self.workers = workers
        self.stats = stats
        self.clock = clock
        self.dispatcher_id = 0
        #: hot-path pipelines sent (for the stop line: messages per round trip).
        self.round_trips = 0
        # The requeue schedule (monotonic seconds).
        self.requeue_dirty = False
        self.requeue_at = 0.0
        self.last_requeue = -INF
        #: requeue_due itself failed (a poisoned paused row): not again before this.
        self.requeue_blocked_until = 0.0
        self._requeue_sums = [0, 0, 0]
        self._requeue_logged = -INF
        #: when statistics were last flushed (cleared only after a flush succeeded).
        self.last_flush = clock()

    # == planning ================================================================
    def requeue_due(self, now: float, shutting_down: bool) -> bool:
        """Is requeue_due to run now?"""
        return (
            not shutting_down
            and now >= self.requeue_blocked_until
            and (
                now >= self.requeue_at
                or (self.requeue_dirty and now - self.last_requeue >= REQUEUE_AFTER_ANSWERS)
            )
        )

    def requeue_deadline(self) -> float:
        """When requeue_due is next due (for the select timeout)."""
        blocked = self.requeue_blocked_until
        t = max(self.requeue_at, blocked)
        if self.requeue_dirty:
            t = min(t, max(self.last_requeue + REQUEUE_AFTER_ANSWERS, blocked))
        return t

    def plan(self, now: float, shutting_down: bool, peek: bool = False) -> Plan:
        """The database work due now (empty while the database is not ready).
        ``peek``: for the select timeout, changing nothing in the ledger."""
        if not self.link.ready(now):
            return Plan(OwedWrites())
        ledger = self.ledger
        requeue = self._requeue_args() if self.requeue_due(now, shutting_down) else None
        # An id owed a write may meanwhile be in flight again at its next stage
        # (the stage advanced it, we claimed it, then read the old answer): the
        # ledger drops such writes (and lowers the floors first).
        plan = Plan(ledger.owed(peek), requeue)
        # With a requeue in the pipeline, claim too: the claim runs after it and
        # picks up the rows it just made pending, in the same round trip.
        if (ledger.claim_needed or requeue) and not shutting_down:
            stages, caps = self.workers.capacity(now)
            if stages:
                # A requeue in the same pipeline may make low ids pending just before
                # the claim: that claim goes unbounded (about once a second when busy).
                plan.claim = (stages, caps, ledger.claim_bounds(stages, requeue is not None))
        return plan

    def due(self, now: float, shutting_down: bool) -> bool:
        """``bool(self.plan(now, shutting_down))`` without building the plan: the
        select timeout asks this on every wake. Same conditions as :meth:`plan`."""
        if not self.link.ready(now):
            return False
        if self.requeue_due(now, shutting_down) or self.ledger.owes_writes():
            return True
        return self.ledger.claim_needed and not shutting_down and self.workers.has_room(now)

    def flush_deadline(self, idle: bool) -> float:
        """When pending statistics are next flushed (INF: none pending)."""
        if not self.stats.pending():
            return INF
        t = self.last_flush + self.dispatch_config.stats_interval
        return min(t, self.last_flush + IDLE_FLUSH_MIN) if idle else t

    # == sending =================================================================
    def run(self, plan: Plan, now: float) -> WakeFacts:
        """Send ``plan`` in one round trip (the release first); return what it
        claimed (nothing when the connection broke: DatabaseLink.lost has run)."""
        facts = WakeFacts()
        ledger = self.ledger
        owed = plan.owed
        try:
            if owed.releases:
                # Separate statement first: released rows become claimable in
                # the same iteration's claim.
                self.db.release(self.dispatcher_id, owed.releases)
                log.debug("released %d row(s): %s", len(owed.releases), ids_text(owed.releases))
            ledger.released()
            t0 = self.clock()
            result = self.db.iteration(
                self.dispatcher_id, owed.failures, owed.checks, plan.requeue, plan.claim
            )
            self.stats.round_trip(self.clock() - t0, plan.claim is not None)
            self.round_trips += 1
        except psycopg.Error as exc:
            if not self.poisoned(exc):
                self.link.lost(now, exc)
                return facts
            isolated = self.isolate(
                now, exc, owed.failures, owed.checks, plan.requeue, plan.claim, facts
            )
            if isolated is None:
                return facts
            result = isolated
        ledger.sent()
        ledger.claimed_pass()
        self.link.worked()
        self._after_iteration(result, now)
        facts.claimed = result.claimed
        return facts

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
        failures: list[tuple[int, str, str]],
        answered: list[int],
        requeue: tuple[list[str], list[int], int, float | None] | None,
        claim: tuple[list[str], list[int], list[int | None] | None] | None,
        facts: WakeFacts,
    ) -> IterationResult | None:
        """The pipelined round trip failed with the connections intact: run its
        parts one statement at a time, so that one poisoned row or stage stops
        only itself. Rows whose write keeps failing are failed with a short
        dispatch_error saying why; a failing requeue is skipped for a while; a
        stage whose claim fails cools down. None if the connection broke
        meanwhile (then DatabaseLink.lost has run; the owed writes are kept and are
        idempotent, fenced by dispatcher id)."""
        log.error("database round trip failed (%s); running its parts one by one", error_line(exc))
        result = IterationResult([], None, [])
        try:
            if failures:
                self._record_errors_alone(failures)
            if answered:
                result.left_running = self._check_answered_alone(answered)
            if requeue is not None:
                result.requeue = self._requeue_alone(now, requeue)
            if claim is not None:
                result.claimed = self._claim_by_stage(claim, facts)
        except psycopg.Error as lost:
            self.link.lost(now, lost)
            return None
        self.round_trips += 1
        return result

    def _record_errors_alone(self, failures: list[tuple[int, str, str]]) -> None:
        try:
            self.db.record_errors(self.dispatcher_id, failures)
            return
        except psycopg.Error as exc:
            if not self.poisoned(exc):
                raise
        for e in failures:
            try:
                self.db.record_errors(self.dispatcher_id, [e])
            except psycopg.Error as exc:
                if not self.poisoned(exc):
                    raise
                self._fail_poisoned(e[0], f"its {e[1]} could not be recorded", exc)

    def _check_answered_alone(self, answered: list[int]) -> list[tuple[int, str]]:
        try:
            return self.db.check_answered(self.dispatcher_id, answered)
        except psycopg.Error as exc:
            if not self.poisoned(exc):
                raise
        out: list[tuple[int, str]] = []
        for message_id in answered:
            try:
                out.extend(self.db.check_answered(self.dispatcher_id, [message_id]))
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
            self.db.record_errors(self.dispatcher_id, [(message_id, "failed", reason)])
        except psycopg.Error as again:
            if not self.poisoned(again):
                raise
            log.error(
                "message %d: cannot fail it either (%s); it stays running, held by this"
                " dispatcher, until a restart resets it",
                message_id,
                error_line(again),
            )

    def _requeue_alone(
        self, now: float, requeue: tuple[list[str], list[int], int, float | None]
    ) -> Requeue | None:
        try:
            return self.db.requeue_due(*requeue)
        except psycopg.Error as exc:
            if not self.poisoned(exc):
                raise
            log.error(
                "requeue_due failed (%s); paused rows are not requeued, next try in %g s",
                error_line(exc),
                REQUEUE_RETRY_AFTER_ERROR,
            )
            self.requeue_at = self.requeue_blocked_until = now + REQUEUE_RETRY_AFTER_ERROR
            return None

    def _claim_by_stage(self, claim: ClaimArgs, facts: WakeFacts) -> list[tuple[int, str]]:
        stages, caps, after_ids = claim
        try:
            return self.db.claim(self.dispatcher_id, stages, caps, after_ids)
        except psycopg.Error as exc:
            if not self.poisoned(exc):
                raise
        out: list[tuple[int, str]] = []
        for i, stage in enumerate(stages):
            after = None if after_ids is None else [after_ids[i]]
            try:
                out.extend(self.db.claim(self.dispatcher_id, [stage], [caps[i]], after))
            except psycopg.Error as exc:
                if not self.poisoned(exc):
                    raise
                log.error("stage %s: claim failed: %s", stage, error_line(exc))
                facts.claim_failed.append(stage)
        return out

    def _requeue_args(self) -> tuple[list[str], list[int], int, float | None]:
        policy = self.workers.max_retries()
        stages = list(policy)
        retries = [policy[s] for s in stages]
        # Rows of stages no longer configured get the default cap (10).
        # EXPIRY = 0 means "never expire" (NULL), not "expire everything at once".
        return (
            stages,
            retries,
            10,
            self.dispatch_config.expiry if self.dispatch_config.expiry > 0 else None,
        )

    def _after_iteration(self, result: IterationResult, now: float) -> None:
        for message_id, stage in result.left_running:
            log.warning(
                "stage %s answered 0 for message %d but left it running; failed it",
                stage,
                message_id,
            )
        if result.requeue is not None:
            self.requeued(result.requeue, now)
        if self.count_retried(result):
            self.requeue_at = now  # learn when they are due
        if result.claimed:
            self.ledger.raise_floors(result.claimed)

    def count_retried(self, result: IterationResult) -> bool:
        """Failures record_dispatch_error paused for an automatic retry (RETRY_DELAY)
        are not failures in the statistics; True if there were any."""
        for _message_id, stage, status, reason in result.retried:
            self.stats.retried(stage, status, reason)
        return bool(result.retried)

    def requeued(self, r: Requeue, now: float) -> None:
        self.last_requeue = now
        self.requeue_dirty = False
        if r.next_due_in is None:
            self.requeue_at = INF
        elif r.next_due_in <= 0:
            # More were due than one call moves: go again soon.
            self.requeue_at = now + (0.01 if r.requeued else 1.0)
        else:
            # +5 ms: wake just after the row is due, not just before.
            self.requeue_at = now + r.next_due_in + 0.005
        if r.requeued:
            self.ledger.forget_floors()  # requeued rows are pending again with their low ids
        if r.requeued or r.exhausted or r.expired:
            self.stats.requeued += r.requeued
            self.stats.expired += r.expired
            for stage, n in r.exhausted_by_stage:
                self.stats.exhausted(stage, n)
            self.ledger.want_claim()
            # One INFO line per minute at most (the first one at once): a stage
            # that pauses a lot would otherwise log every second all hour.
            sums = self._requeue_sums
            sums[0] += r.requeued
            sums[1] += r.exhausted
            sums[2] += r.expired
            if now - self._requeue_logged >= REQUEUE_LOG_EVERY:
                self.log_requeues(now)
            else:
                log.debug(
                    "paused rows due: %d requeued, %d exhausted, %d expired",
                    r.requeued,
                    r.exhausted,
                    r.expired,
                )

    def log_requeues(self, now: float) -> None:
        sums = self._requeue_sums
        if any(sums):
            log.info(
                "paused rows due%s: %d requeued, %d failed (retries exhausted), %d expired",
                "" if self._requeue_logged == -INF else " since the last such line",
                *sums,
            )
        self._requeue_sums = [0, 0, 0]
        self._requeue_logged = now

    # == statistics ==============================================================
    def flush_stats(self, now: float, force: bool = False) -> None:
        """Flush the statistics when due (STATS_INTERVAL, or going idle); they
        are cleared only after the flush went through (invariant 10,
        docs/INTERNALS.md)."""
        if not self.stats.pending():
            return
        due = now - self.last_flush >= self.dispatch_config.stats_interval
        if not due and now - self.last_flush >= IDLE_FLUSH_MIN:
            due = not self.workers.busy()
        if not (due or force):
            return
        try:
            self.db.flush_stats(self.stats.flush_args())
        except psycopg.Error as exc:
            if not self.poisoned(exc):
                self.link.lost(now, exc)
                return
            # Deltas the database refuses would block every later flush (and,
            # through DatabaseLink.lost, all database work): drop them, loudly.
            log.error("statistics flush failed (%s); these deltas are dropped", error_line(exc))
        self.stats.clear()
        self.last_flush = now

    # == after a reconnect, at the end ===========================================
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
        held = self.db.held(self.dispatcher_id)
        checks = self.ledger.checks_to_verify(held)
        return self.ledger.strays(held, self.db.stages_of(checks) if checks else None)

    def declared_dead(self) -> bool:
        """Competing: were we declared dead (heartbeat older than ORPHAN_TIMEOUT)?

        Then another replica has reset our running rows, and may already run
        them: the loop must kill every worker and drop every id before the
        heartbeat registers us again (:meth:`Dispatcher.check_registration`).
        """
        return self.dispatch_config.competing and not self.db.registered(self.dispatcher_id)

    def release_strays(self) -> None:
        """After a reconnect: rows we hold that no worker has go back to pending
        (rows with an owed failure or answer check are left for those writes)."""
        stray = self.strays()
        if stray:
            self.db.release(self.dispatcher_id, stray)
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
                self.count_retried(
                    self.db.iteration(self.dispatcher_id, owed.failures, owed.checks, None, None)
                )
                self.ledger.sent_writes()
            if self.stats.pending():
                self.db.flush_stats(self.stats.flush_args())
                self.stats.clear()
        except psycopg.Error as exc:
            log.warning("could not settle owed writes and stats: %s", error_line(exc))

    def settle_at_exit(self) -> int:
        """All workers are gone: send the owed writes, release every row we
        hold, flush, unregister. Returns the rows released; raises psycopg.Error."""
        ledger = self.ledger
        if ledger.failures or ledger.checks:
            self.count_retried(
                self.db.iteration(self.dispatcher_id, ledger.failures, ledger.checks, None, None)
            )
            ledger.sent_writes()
        n = self.db.release(self.dispatcher_id, None)
        ledger.released()
        if self.stats.pending():
            self.db.flush_stats(self.stats.flush_args())
            self.stats.clear()
        self.db.unregister(self.dispatcher_id)
        return n


__all__ = ["Pipeline", "Plan", "StageRoom", "WakeFacts"]
