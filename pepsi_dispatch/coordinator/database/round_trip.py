"""The database work of one wake, planned once and sent in one round trip.

:meth:`RoundTrip.plan` says what is due now -- the owed writes (releases
first, in their own statement, then failures and answer checks), the
paused-row flip (``pepsi.requeue_due``) when its timer says so, and ONE claim
for every stage with room. :meth:`RoundTrip.due` answers the same question
without building the plan (the select timeout asks it on every wake; a unit
test holds the two equal). :meth:`RoundTrip.run` sends the plan and returns
what it found as :class:`RoundTripFacts` -- rows claimed, stages whose claim
failed -- for the loop to route to the workers' side: this side never touches a
worker. When the round trip fails with the connections intact, its parts run
one statement at a time (:mod:`.isolation`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import psycopg

from pepsi_dispatch.config import DispatchConfig
from pepsi_dispatch.contract import INF
from pepsi_dispatch.coordinator.database.fence import Fence
from pepsi_dispatch.coordinator.database.flip import PausedFlip
from pepsi_dispatch.coordinator.database.isolation import Isolation
from pepsi_dispatch.coordinator.database.link import DatabaseLink
from pepsi_dispatch.coordinator.database.port import (
    ClaimParams,
    DispatchStore,
    RequeueParams,
    RoundTripParams,
    RoundTripResult,
)
from pepsi_dispatch.coordinator.database.settle import count_retried
from pepsi_dispatch.coordinator.ledger import Ledger, OwedWrites, ids_text
from pepsi_dispatch.coordinator.stats import Stats

log = logging.getLogger(__name__)


@dataclass
class Plan:
    """The database work of one wake; empty (false) when nothing is due."""

    owed: OwedWrites
    requeue: RequeueParams | None = None
    claim: ClaimParams | None = None

    def __bool__(self) -> bool:
        return bool(self.owed) or self.requeue is not None or self.claim is not None


class StageRoom(Protocol):
    """What the round trip needs to know of the workers' side: how many ids
    each stage can take now. The loop passes the supervisor; the database side
    never imports it."""

    def capacity(self, now: float) -> tuple[list[str], list[int]]: ...

    def has_room(self, now: float) -> bool: ...

    def line_limits(self, stages: list[str]) -> list[int]:
        """For each stage, the longest line (bytes) its workers take a claimed
        row as, instead of the bare id; 0: bare ids only."""
        ...


@dataclass
class RoundTripFacts:
    """What one round trip found, for the loop to route to the workers' side:
    rows claimed (to be placed on workers) and stages whose claim failed on
    its own (to be held off)."""

    claimed: list[tuple[int, str]] = field(default_factory=list)
    claim_failed: list[str] = field(default_factory=list)
    #: claimed rows as workers' lines, by id (see RoundTripResult.lines)
    lines: dict[int, str] = field(default_factory=dict)


class RoundTrip:
    """Plans and sends the database work of a wake (see the module's text)."""

    name = "database round trip"

    def __init__(
        self,
        dispatch_config: DispatchConfig,
        db: DispatchStore,
        link: DatabaseLink,
        ledger: Ledger,
        rooms: StageRoom,
        stats: Stats,
        clock: Callable[[], float],
        fence: Fence,
        flip: PausedFlip,
        isolation: Isolation,
        stopping: Callable[[], bool],
    ) -> None:
        self.dispatch_config = dispatch_config
        self.db = db
        self.link = link
        self.ledger = ledger
        self.rooms = rooms
        self.stats = stats
        self.clock = clock
        self.fence = fence
        self.flip = flip
        self.isolation = isolation
        #: is the dispatcher stopping (then no more claims or flips)?
        self.stopping = stopping
        #: round trips sent (for the stop line: messages per round trip).
        self.count = 0

    # == planning ================================================================
    def _flip_due(self, now: float, shutting_down: bool) -> bool:
        return not shutting_down and self.flip.is_due(now)

    def plan(self, now: float, shutting_down: bool) -> Plan:
        """The database work due now (empty while the database is not ready)."""
        if not self.link.ready(now):
            return Plan(OwedWrites())
        ledger = self.ledger
        requeue = self._requeue_args() if self._flip_due(now, shutting_down) else None
        # An id owed a write may meanwhile be in flight again at its next stage
        # (the stage advanced it, we claimed it, then read the old answer): the
        # ledger drops such writes (and lowers the floors first).
        plan = Plan(ledger.owed(), requeue)
        # With a requeue in the round trip, claim too: the claim runs after it and
        # picks up the rows it just made pending, in the same round trip.
        if (ledger.claim_needed or requeue) and not shutting_down:
            stages, caps = self.rooms.capacity(now)
            if stages:
                # A requeue in the same round trip may make low ids pending just before
                # the claim: that claim goes unbounded (about once a second when busy).
                bounds = ledger.claim_bounds(stages, requeue is not None)
                plan.claim = ClaimParams(stages, caps, bounds, self.rooms.line_limits(stages))
        return plan

    def due(self, now: float, shutting_down: bool) -> bool:
        """``bool(self.plan(now, shutting_down))`` without building the plan.
        Same conditions as :meth:`plan`."""
        if not self.link.ready(now):
            return False
        if self._flip_due(now, shutting_down) or self.ledger.owes_writes():
            return True
        return self.ledger.claim_needed and not shutting_down and self.rooms.has_room(now)

    def next_due(self, now: float) -> float:
        """Now when work is due; else the paused-row flip's next time (INF: none)."""
        stopping = self.stopping()
        if self.due(now, stopping):
            return now
        return INF if stopping else self.flip.deadline()

    def _requeue_args(self) -> RequeueParams:
        # EXPIRY = 0 means "never expire" (NULL), not "expire everything at once".
        expiry = self.dispatch_config.expiry
        return RequeueParams(expiry if expiry > 0 else None)

    # == sending =================================================================
    def run(self, now: float) -> RoundTripFacts:
        """Plan and send this wake's work; what it found (nothing if nothing was due)."""
        plan = self.plan(now, self.stopping())
        return self.send(plan, now) if plan else RoundTripFacts()

    def send(self, plan: Plan, now: float) -> RoundTripFacts:
        """Send ``plan`` in one round trip (the release first); return what it
        claimed (nothing when the connection broke: DatabaseLink.lost has run)."""
        facts = RoundTripFacts()
        ledger = self.ledger
        owed = plan.owed
        try:
            if owed.releases:
                # Separate statement first: released rows become claimable in
                # the same round trip's claim.
                self.db.release(self.fence.id, owed.releases)
                log.debug("released %d row(s): %s", len(owed.releases), ids_text(owed.releases))
            ledger.released()
            t0 = self.clock()
            result = self.db.round_trip(
                self.fence.id, RoundTripParams(owed.failures, owed.checks, plan.requeue, plan.claim)
            )
            self.stats.round_trip(self.clock() - t0, plan.claim is not None)
        except psycopg.Error as exc:
            if not self.isolation.poisoned(exc):
                self.link.lost(now, exc)
                return facts
            isolated = self.isolation.isolate(
                now, exc, owed.failures, owed.checks, plan.requeue, plan.claim, facts.claim_failed
            )
            if isolated is None:
                return facts
            result = isolated
        self.count += 1
        ledger.sent()
        ledger.claimed_pass()
        self.link.worked()
        self._after(result, now)
        facts.claimed = result.claimed
        facts.lines = result.lines
        return facts

    def _after(self, result: RoundTripResult, now: float) -> None:
        for message_id, stage in result.left_running:
            log.warning(
                "stage %s answered 0 for message %d but left it running; failed it",
                stage,
                message_id,
            )
            self.stats.left_running(stage)
        if result.requeue is not None:
            self.flip.done(result.requeue, now)
        if count_retried(self.stats, result):
            self.flip.due_now(now)  # learn when they are due
        if result.claimed:
            self.ledger.raise_floors(result.claimed, result.off_floor)

    # == registration ============================================================
    def declared_dead(self) -> bool:
        """Competing: were we declared dead (heartbeat older than ORPHAN_TIMEOUT)?

        Then another replica has reset our running rows, and may already run
        them: the loop must kill every worker and drop every id before the
        heartbeat registers us again.
        """
        return self.dispatch_config.competing and not self.db.registered(self.fence.id)


__all__ = ["Plan", "RoundTrip", "RoundTripFacts", "StageRoom"]
