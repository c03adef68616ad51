"""The in-flight ledger: who holds which id, and the writes owed about ids.

Pure bookkeeping, no I/O: the loop tells it what happened (an id handed to a
worker, an answer read, a worker reaped, a claim returned) and asks it what
to send (the owed writes of the next pipeline, the claim's floors). It is the
one place that enforces **an id is never in two workers**:

- an id handed out is held by exactly one worker handle (``holder_of``); a
  newer hand-out replaces the older holder, whose late answer then leaves
  the id alone;
- a write owed about an id that is held again (the stage advanced the row,
  it was claimed for its next stage before the old answer was read) is
  dropped, never sent: it would fail or release a row another worker runs;
- the writes stay owed until the pipeline carrying them succeeded;
- unanswered ids are released only through :meth:`reaped`, which the loop
  calls after the worker is dead and reaped.

Worker handles are compared by identity; the ledger never looks inside them.
Claim floors: docs/INTERNALS.md, "Claim floors".
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from pepsi_dispatch.contract import INF

#: An owed failure write: (id, status 'failed' or 'timeout', reason).
Failure = tuple[int, str, str]


@dataclass
class OwedWrites:
    """The writes of one pipeline, in the order they are sent: releases (own
    statement, before the claim), then failures, then answer checks."""

    releases: list[int] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    checks: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.releases or self.failures or self.checks)


class Ledger:
    """Who holds which id, the owed writes, and the claim floors."""

    def __init__(self, competing: bool = False) -> None:
        #: floors are never used by a competing replica (docs/INTERNALS.md).
        self.competing = competing
        #: id -> the worker handle that has it in flight.
        self.holder_of: dict[int, Any] = {}
        #: owed failure writes (record_dispatch_error).
        self.failures: list[Failure] = []
        #: ids answered ``0``/OK whose answer check is owed.
        self.checks: list[int] = []
        #: id -> the stage its owed check is for (the last fused stage, if any):
        #: the guard against a lost reply to a committed claim (:meth:`strays`).
        self.check_stage: dict[int, str] = {}
        #: ids owed a release (back to pending).
        self.releases: list[int] = []
        #: stage -> an id at or below which no row of that stage is pending.
        #: Absent = no bound.
        self.floors: dict[str, int] = {}
        #: a claim pass is due (answers freed room, rows may be pending).
        self.claim_needed = True

    # -- holding ---------------------------------------------------------------
    def hand(self, ids: Iterable[int], w: Any) -> None:
        """``ids`` were given to ``w``. An id may still sit unanswered at its
        previous stage's worker (that stage committed the advance): ``w`` owns
        it now. It may be ``w`` itself: then ``w`` holds it twice."""
        holder_of = self.holder_of
        for i in ids:
            holder_of[i] = w

    def let_go(self, i: int, w: Any, still_in_w: bool) -> None:
        """``w`` answered (or timed out on) one copy of ``i``. The id stays held
        while ``w`` still has another copy of it (``still_in_w``)."""
        if self.holder_of.get(i) is w and not still_in_w:
            del self.holder_of[i]

    def holding(self) -> int:
        """How many ids are in flight (the ``inflight_ids`` gauge)."""
        return len(self.holder_of)

    def held(self, i: int) -> bool:
        """Is ``i`` in flight in some worker?"""
        return i in self.holder_of

    # -- answers and failures --------------------------------------------------
    def answered(self, i: int, stage: str) -> None:
        """``i`` was answered ``0``/OK at ``stage`` (its last fused stage): a check is owed."""
        self.checks.append(i)
        self.check_stage[i] = stage

    def failed(self, i: int, status: str, reason: str) -> None:
        """A failure write about ``i`` is owed."""
        self.failures.append((i, status, reason))

    def crashed(
        self, unanswered: list[int], reason: str, blamed: int | None = None, status: str = "failed"
    ) -> None:
        """A worker crashed (or was killed at MAX_RUNTIME: ``status`` 'timeout')
        holding ``unanswered`` (in order): the message whose handler it named as
        running (``blamed``, from its in-hand slot) fails, else its head-of-line
        message; the rest are released (never started, or their work was rolled
        back with it)."""
        if blamed is None or blamed not in unanswered:
            blamed = unanswered[0]
        rest = list(unanswered)
        rest.remove(blamed)
        self.failed(blamed, status, reason)
        self.release(rest)

    def release(self, ids: Iterable[int]) -> None:
        """``ids`` are owed a release (never started, or found no place)."""
        self.releases.extend(ids)

    def unplaced(self, ids: Iterable[int]) -> None:
        """Claimed ``ids`` found no worker: they are owed a release, and no worker
        holds them. A holder still recorded for one is its previous stage's
        worker (that stage committed the advance; its answer is on the way): the
        claim superseded it. Left in place, it would make :meth:`owed` drop the
        release, and the old answer's check would then fail the row, which our
        claim holds with no worker ('answered 0 but left it running')."""
        holder_of = self.holder_of
        for i in ids:
            holder_of.pop(i, None)
            self.releases.append(i)

    def reaped(self, w: Any, unanswered: list[int], undelivered: list[int]) -> None:
        """``w`` is dead and reaped: it no longer holds anything. Its undelivered
        ids (never written, EPIPE) are released; the unanswered ones are settled
        by the caller as the exit classification says."""
        holder_of = self.holder_of
        for i in unanswered + undelivered:
            if holder_of.get(i) is w:
                del holder_of[i]
        self.releases.extend(undelivered)

    # -- the pipeline ------------------------------------------------------------
    def owed(self) -> OwedWrites:
        """The writes to send now, the floors lowered for them first. Those about
        ids in flight again are dropped for good (never sent); the rest stay
        owed until :meth:`released` / :meth:`sent`. (The select timeout only
        asks :meth:`owes_writes`: dropping must wait until the wake that sends,
        whose events may first have let go of an id.)
        """
        holder_of = self.holder_of
        self.lower_floors(OwedWrites(self.releases, self.failures, self.checks))
        if holder_of and (self.failures or self.checks or self.releases):
            self.failures = [e for e in self.failures if e[0] not in holder_of]
            self.checks = [i for i in self.checks if i not in holder_of]
            self.releases = [i for i in self.releases if i not in holder_of]
        return OwedWrites(list(self.releases), list(self.failures), list(self.checks))

    def owes_writes(self) -> bool:
        """Would :meth:`owed` send anything now? Changes nothing, builds no lists."""
        if not (self.releases or self.failures or self.checks):
            return False
        holder = self.holder_of
        return (
            any(i not in holder for i in self.releases)
            or any(e[0] not in holder for e in self.failures)
            or any(i not in holder for i in self.checks)
        )

    def released(self) -> None:
        """The release statement (sent first, on its own) succeeded."""
        self.releases = []

    def sent(self) -> None:
        """The pipeline carrying the failures and checks succeeded."""
        self.failures = []
        self.checks = []
        self.check_stage.clear()

    def sent_writes(self) -> None:
        """Failures and checks went out (abort, shutdown), the check stages stay."""
        self.failures = []
        self.checks = []

    def drop_all(self) -> None:
        """Declared dead by another replica: our rows were reset; forget everything."""
        self.holder_of.clear()
        self.failures, self.checks, self.releases = [], [], []
        self.check_stage.clear()
        self.rescan()

    def forget_holders(self) -> None:
        """The server restarted and every worker was stopped: no id is in hand any
        more. The owed failures stay (fenced by dispatcher_id, they leave alone a
        row whose claim the restart lost). The owed answer checks go: a commit
        the restart lost (asynchronous commit, an asynchronous standby) may have
        put the row back as it was, and failing it as "answered 0 but left it
        running" would blame the worker; it is released with the strays and
        runs again, at least once as after any crash. The floors go too."""
        self.holder_of.clear()
        self.checks.clear()
        self.check_stage.clear()
        self.rescan()

    def strays(self, held_in_db: set[int], check_stage_now: dict[int, str] | None) -> list[int]:
        """Rows the database says we hold but no worker has (after a reconnect).

        Rows with an owed write are left for that write -- except a row owed a
        check that is no longer at the stage its answer was for: the stage
        advanced it and a lost claim took it again; its check is dropped and
        it is released. ``check_stage_now`` maps the ids of :meth:`checks_to_verify`
        to their stage now (None: none to verify).
        """
        held = held_in_db - set(self.releases)
        owed = {e[0] for e in self.failures}
        owed.update(self.holder_of)
        if check_stage_now is not None:
            moved = {
                i
                for i in self.checks_to_verify(held_in_db)
                if check_stage_now.get(i) != self.check_stage.get(i)
            }
            if moved:
                self.checks = [i for i in self.checks if i not in moved]
                for i in moved:
                    self.check_stage.pop(i, None)
        owed.update(self.checks)
        return sorted(held - owed)

    def checks_to_verify(self, held_in_db: set[int]) -> set[int]:
        """Ids held in the database whose only owed write is a check: their stage
        must be looked up before :meth:`strays` decides."""
        held = held_in_db - set(self.releases)
        owed = {e[0] for e in self.failures}
        owed.update(self.holder_of)
        return (held & set(self.checks)) - owed

    # -- claims and floors -------------------------------------------------------
    def want_claim(self) -> None:
        """Room or rows may have appeared: a claim pass is due."""
        self.claim_needed = True

    def rescan(self) -> None:
        """Low ids may be pending again (a notification, a reconnect, a reload):
        forget the floors and claim."""
        self.floors.clear()
        self.claim_needed = True

    def forget_floors(self) -> None:
        """Rows may be pending below the floors (a requeue, the heartbeat tick)."""
        self.floors.clear()

    def claimed_pass(self) -> None:
        """A pipeline ran: the claim pass it carried (if any) is done."""
        self.claim_needed = False

    def lower_floors(self, writes: OwedWrites) -> None:
        """Rows answered, failed or released may be pending again (at any stage)
        with their own id: no floor may stay at or above the lowest of them."""
        floors = self.floors
        if not floors:
            return
        low = min(
            min(writes.checks, default=INF),
            min((e[0] for e in writes.failures), default=INF),
            min(writes.releases, default=INF),
        )
        if low == INF:
            return
        for stage, f in floors.items():
            if f >= low:
                floors[stage] = int(low) - 1

    def claim_bounds(self, stages: list[str], with_requeue: bool) -> list[int | None] | None:
        """The claim's after_ids for ``stages``: None (unbounded) when competing,
        when no floor is known, or when a requeue shares the pipeline (it may
        make low ids pending just before the claim)."""
        if self.competing or with_requeue or not self.floors:
            return None
        return [self.floors.get(s) for s in stages]

    def raise_floors(self, claimed: list[tuple[int, str]], off_floor: Collection[int] = ()) -> None:
        """The claim took a stage's lowest pending priority-0 ids above its floor
        (after any of a higher priority): every pending priority-0 row of that
        stage up to the highest such id returned is claimed. ``off_floor`` are
        the claimed ids whose priority is not 0; the floor does not bound those
        rows, so they never raise it."""
        if self.competing:
            return
        floors = self.floors
        skip = set(off_floor) if off_floor else ()
        for i, stage in claimed:
            if i > floors.get(stage, 0) and i not in skip:
                floors[stage] = i


def ids_text(ids: Iterable[int]) -> str:
    """Short rendering of an id list for log lines."""
    ids = list(ids)
    if len(ids) <= 10:
        return ",".join(map(str, ids))
    return ",".join(map(str, ids[:10])) + f",… ({len(ids)} ids)"


__all__ = ["Failure", "Ledger", "OwedWrites", "ids_text"]
