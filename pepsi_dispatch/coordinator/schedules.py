"""The ``[schedule-NAME]`` sections at run time: one message per tick.

The :class:`Scheduler` is one of the loop's duties (coordinator/duties.py):
its :meth:`~Scheduler.next_due` is the earliest next tick, so the loop wakes
for a tick and for nothing else (no polling, no wake when nothing is due),
and :meth:`~Scheduler.run` enqueues the ticks that are due. A due tick goes to
``pepsi.fire_schedule``, which records it in ``pepsi.schedule_ticks`` in the
same transaction as its message, under the schedule's row lock: competing
replicas fire the same ticks and exactly one message per tick is enqueued.

Which ticks (pepsi_dispatch/config/schedule.py ``missed_ticks``): on every
firing, the ticks after the last one settled, as CATCH_UP allows -- the
current one, and at most CATCH_UP of the missed ones (N ticks, or a time span). One rule for every
gap, whatever caused it: a stop, a reload, a reconnect, a frozen process, a
suspended host, a clock step, a late wake. A tick is "settled" once the
database has it; what we remember of that (``settled``) only saves calls: the
database refuses a settled tick whatever we send.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from pepsi_dispatch.config.schedule import ScheduleConfig, missed_ticks, next_tick
from pepsi_dispatch.contract import INF
from pepsi_dispatch.coordinator.database.link import error_line
from pepsi_dispatch.coordinator.database.port import (
    DispatchStore,
    FireScheduleParams,
    LockBusy,
    RegisterSchedulesParams,
    StoreError,
    StoreUnreachable,
)

log = logging.getLogger(__name__)


#: After a statement error that is not a lost connection (a dropped stage
#: name, missing privileges): try the schedule again this much later.
RETRY_AFTER_ERROR = 30.0
#: After pepsi.fire_schedule gave up waiting for a lock (its lock_timeout):
#: try that schedule again this much later; the loop goes on meanwhile.
RETRY_AFTER_LOCK = 1.0


class Scheduler:
    """The schedules of one configuration, as a duty: their settled and next ticks."""

    name = "schedules"

    def __init__(
        self,
        schedules: Mapping[str, ScheduleConfig],
        db: DispatchStore,
        active: Callable[[], bool] = lambda: True,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """``active``: False while the dispatcher stops (no ticks then). ``wall``
        (aware UTC now) is injected for tests; the loop passes its monotonic
        ``now`` to :meth:`next_due` and :meth:`run`."""
        self.db = db
        self.active = active
        self.wall = wall
        self.schedules = dict(schedules)
        #: name -> every tick at or before this is in the database.
        self.settled: dict[str, datetime] = {}
        #: name -> the next tick to fire (wall clock).
        self.next: dict[str, datetime] = {}
        #: name -> monotonic time before which a failing schedule is not tried.
        self.blocked_until: dict[str, float] = {}
        self.registered = False
        #: monotonic time before which a failed registration is not tried again.
        self.register_blocked_until = 0.0
        #: name -> the last tick settled under the name it had before a reload
        #: renamed it (the same section, nothing else changed): not fired again.
        self.renamed_from: dict[str, datetime] = {}

    def replace(self, schedules: Mapping[str, ScheduleConfig]) -> None:
        """A reloaded configuration: register again before firing. A schedule
        renamed by it takes along what its old name settled, so that no tick is
        enqueued under both names (its new name may have an older record of
        its own: a name put back)."""
        new = dict(schedules)
        gone = [s for name, s in self.schedules.items() if name not in new]
        for name, s in new.items():
            if name in self.schedules:
                continue
            for old in gone:
                settled = self.settled.get(old.name) or self.renamed_from.get(old.name)
                if settled is not None and dataclasses.replace(old, name=name) == s:
                    self.renamed_from[name] = max(settled, self.renamed_from.get(name, settled))
        self.renamed_from = {n: t for n, t in self.renamed_from.items() if n in new}
        self.schedules = new
        self.registered = False

    def register(self) -> None:
        """Tell the database our schedules (start, reload, reconnect); learn
        what is settled, and so when the next tick is due (now, if a tick was
        missed). Raises StoreError."""
        now = self.wall()
        scheds = list(self.schedules.values())
        nexts = [next_tick(s, now) for s in scheds]
        rows = self.db.register_schedules(
            RegisterSchedulesParams(
                [s.name for s in scheds],
                [s.stage for s in scheds],
                [s.spec() for s in scheds],
                nexts,
            )
        )
        self.settled, self.next, self.blocked_until = {}, {}, {}
        for s, nxt in zip(scheds, nexts, strict=True):
            settled = rows.get(s.name)
            renamed = self.renamed_from.get(s.name)
            if settled is not None and renamed is not None and renamed > settled:
                settled = renamed  # enqueued under its old name: not again under this one
            missed = missed_ticks(s, settled, now)
            self.settled[s.name] = settled or now  # never registered: owes nothing
            self.next[s.name] = missed[0] if missed else nxt
        self.registered = True
        if scheds:
            log.info(
                "schedules: %s",
                ", ".join(
                    f"{s.name} ({s.spec()} -> {s.stage}, next {self.next[s.name]:%H:%M:%S})"
                    for s in scheds
                ),
            )

    def next_due(self, now: float) -> float:
        """Monotonic time of the earliest due tick (INF: no schedules, or stopping)."""
        if not self.schedules or not self.active():
            return INF
        if not self.registered:
            return INF if not self.schedules else self.register_blocked_until
        if not self.next:
            return INF
        wall_now = self.wall()
        mono_now = now
        best = INF
        for name, tick in self.next.items():
            at = mono_now + (tick - wall_now).total_seconds()
            best = min(best, max(at, self.blocked_until.get(name, 0.0)))
        return best

    def run(self, now: float) -> None:
        """Enqueue every due tick (register first if needed). Raises StoreError
        for a lost connection only."""
        self.fire_due(now)

    def fire_due(self, mono: float) -> int:
        """:meth:`run`, returning the number of messages enqueued."""
        if not self.schedules or not self.active():
            return 0
        if not self.registered:
            if self.register_blocked_until > mono:
                return 0
            try:
                self.register()
            except StoreUnreachable:
                raise
            except StoreError as exc:
                log.error(
                    "schedules: registering them failed (%s); next try in %g s",
                    error_line(exc),
                    RETRY_AFTER_ERROR,
                )
                self.register_blocked_until = mono + RETRY_AFTER_ERROR
                return 0
        now = self.wall()
        n = 0
        for s in self.schedules.values():
            if self.next[s.name] > now or self.blocked_until.get(s.name, 0.0) > mono:
                continue
            # Bounded by CATCH_UP whatever the gap since the last tick settled.
            ticks = missed_ticks(s, self.settled[s.name], now)
            try:
                n += self._fire(s, ticks)
            except LockBusy:
                # Another transaction holds the schedule's row or its dedupe key
                # (a producer's open transaction); fire_schedule waited 200 ms.
                log.info(
                    "schedule %s: its tick waits for a lock another transaction holds"
                    " (the schedule's row or its dedupe key); next try in %g s",
                    s.name,
                    RETRY_AFTER_LOCK,
                )
                self.blocked_until[s.name] = mono + RETRY_AFTER_LOCK
            except StoreUnreachable:
                raise
            except StoreError as exc:
                log.error(
                    "schedule %s: enqueuing its tick failed (%s); next try in %g s",
                    s.name,
                    error_line(exc),
                    RETRY_AFTER_ERROR,
                )
                self.blocked_until[s.name] = mono + RETRY_AFTER_ERROR
        return n

    def _fire(self, s: ScheduleConfig, ticks: list[datetime]) -> int:
        # The first tick after the last one given: normally after now; after a
        # long catch-up (MAX_TICKS_PER_CALL) maybe already due, then the next
        # wake fires it.
        following = next_tick(s, max([self.settled[s.name], *ticks]))
        rows = self.db.fire_schedule(
            FireScheduleParams(
                s.name, ticks, s.stage, s.payload_object(), s.priority, s.dedupe_key, following
            )
        )
        if ticks:
            self.settled[s.name] = max(self.settled[s.name], max(ticks))
        self.next[s.name] = following
        inserted = [r for r in rows if r[2]]
        for tick, mid, _new in inserted:
            log.info("schedule %s: tick %s enqueued as message %d", s.name, _iso(tick), mid)
        for tick, mid, _new in (r for r in rows if not r[2]):
            log.info(
                "schedule %s: tick %s not enqueued: message %d still holds key %r",
                s.name,
                _iso(tick),
                mid,
                s.dedupe_key,
            )
        return len(inserted)


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat(timespec="seconds")


__all__ = ["Scheduler"]
