"""The database behind one port: every call the coordinator makes on its store.

:class:`DispatchStore` is the port. The coordinator's parts (the dispatcher,
start-up, the schedules, the comeback checks, the round trip, the link, the
isolation, the settlement, the stats flush) are given a ``DispatchStore`` and
know nothing else of the database; :class:`~.postgres.PostgresStore` implements
it on PostgreSQL (every statement the coordinator sends is there), and the unit
tests use a typed fake (``tests/python/support/fake_store.py``).

Each query is one method with one params type when it takes more than the
fencing token (the dispatcher id) and an argument or two: a NamedTuple whose
field names are the statement's named parameters. What the statements return
is decoded into the result types below.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, NamedTuple, Protocol

import psycopg

from pepsi_dispatch.config import StageConfig

#: (message id, status, reason): a failure for ``pepsi.record_dispatch_error``.
Failure = tuple[int, str, str]
#: The server's start time and its last crash recovery's, as text.
Epoch = tuple[str, str]
#: (tick, message id, inserted) per tick ``pepsi.fire_schedule`` handled.
FiredTick = tuple[datetime, int, bool]

#: The errors of a call that mean "the connection is gone": the loop reconnects.
CONNECTION_LOST: Final = (psycopg.OperationalError, psycopg.InterfaceError)

# What the store raises, as the rest of the coordinator catches it: the driver's
# own classes, named here so that no coordinator module outside database/ imports
# the driver (an import-linter contract in pyproject.toml keeps it so).
#: Any error of a call (the base class of the others).
StoreError = psycopg.Error
#: The server is unreachable or the connection broke (``psycopg.OperationalError``).
StoreUnreachable = psycopg.OperationalError
#: A lock the call waited on past its lock_timeout (SQLSTATE 55P03).
LockBusy = psycopg.errors.LockNotAvailable
#: The pepsi schema, or a function of it, is not there (not migrated).
SCHEMA_MISSING: Final = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.InvalidSchemaName,
)
#: The role may not call what it called (SQLSTATE 42501).
NotPermitted = psycopg.errors.InsufficientPrivilege

#: What :meth:`DispatchStore.notifications` returns for NOTIFY workqueue, 'delayed'
#: (pepsi.enqueue of a delayed message: run requeue_due to learn its due time).
DELAYED: Final = "workqueue:delayed"
#: What :meth:`DispatchStore.notifications` returns, followed by the stage's name,
#: for NOTIFY config_changed, 'try_now:STAGE' (pepsi.pause_stage resuming a stage:
#: end its hold-off now). Not a reload: the overlay may not have changed.
TRY_NOW: Final = "try_now:"


# == params ======================================================================
class RequeueParams(NamedTuple):
    """``pepsi.requeue_due``: EXPIRY in seconds (None: nothing expires). The retry
    policy is the stage registry's (pepsi.stages), not an argument."""

    expiry: float | None


class ClaimParams(NamedTuple):
    """The claim (``pepsi.claim_lines``): the stages with room, their capacities,
    the claim floors (aligned with the stages; None: unbounded) and each stage's
    longest worker line in bytes (None or 0: bare ids)."""

    stages: list[str]
    caps: list[int]
    after_ids: list[int | None] | None
    line_limits: list[int] | None = None


class RoundTripParams(NamedTuple):
    """One wake's writes and claim: failures for ``pepsi.record_dispatch_error``,
    ids answered ``0`` for ``pepsi.check_answered``, then ``pepsi.requeue_due``
    and the claim when given."""

    failures: Sequence[Failure]
    answered: Sequence[int]
    requeue: RequeueParams | None = None
    claim: ClaimParams | None = None


class RegisterSchedulesParams(NamedTuple):
    """``pepsi.register_schedules``: the schedules, aligned, with each one's next tick."""

    names: list[str]
    stages: list[str]
    specs: list[str]
    nexts: list[datetime]


class FireScheduleParams(NamedTuple):
    """``pepsi.fire_schedule``: a schedule's due ticks and the message each enqueues."""

    name: str
    ticks: list[datetime]
    stage: str
    payload: dict[str, Any]
    priority: int
    dedupe_key: str | None
    next_tick: datetime


# == results =====================================================================
@dataclass(frozen=True, slots=True)
class Requeue:
    """Result of ``pepsi.requeue_due``: counts and seconds until the next due row.

    ``exhausted_by_stage`` / ``expired_by_stage``: (stage, count) pairs, the
    per-stage split of ``exhausted`` / ``expired`` (requeue_due v2).
    """

    requeued: int
    exhausted: int
    expired: int
    next_due_in: float | None
    exhausted_by_stage: tuple[tuple[str, int], ...] = ()
    expired_by_stage: tuple[tuple[str, int], ...] = ()


class ClaimedRows(NamedTuple):
    """What a claim returned: (id, stage) of the claimed rows, the ids among them
    of priority not 0, and the rows returned as workers' lines, by id."""

    claimed: list[tuple[int, str]]
    off_floor: list[int]
    lines: dict[int, str]


@dataclass(slots=True)
class RoundTripResult:
    """What one :meth:`DispatchStore.round_trip` returned."""

    left_running: list[tuple[int, str]]
    requeue: Requeue | None
    claimed: list[tuple[int, str]]
    #: claimed ids of priority != 0: claim floors bound priority-0 rows only.
    off_floor: list[int] = field(default_factory=list)
    #: claimed rows as workers' lines (``pepsi.claim_lines``), by id; an id
    #: without one is handed as the bare id.
    lines: dict[int, str] = field(default_factory=dict)
    #: failures record_dispatch_error paused for an automatic retry instead of
    #: failing: (id, stage, status, reason) of the ``failures`` entries it retried.
    retried: list[tuple[int, str, str, str]] = field(default_factory=list)


# == the port ====================================================================
class DispatchStore(Protocol):
    """Every call the coordinator makes on its database.

    Two connections stand behind it: the *listen* one holds the advisory lock
    and LISTENs; the *work* one runs every query, each in its own implicit
    transaction. Queries raise :data:`StoreError`; one of
    :data:`CONNECTION_LOST` means the connection is gone.
    """

    @property
    def competing(self) -> bool:
        """Competing mode: a shared lock, a wait for the other replicas after
        connecting, no claim floors."""
        ...

    @property
    def server_epoch(self) -> Epoch | None:
        """The server's start and crash-restart times, read at each connect of the
        work connection (None before the first)."""
        ...

    # -- connections --------------------------------------------------------------
    def connect(self) -> None:
        """Open both connections (closing any old ones first)."""
        ...

    def connect_work(self) -> None:
        """(Re)open only the work connection; the listen one (and its lock) stays."""
        ...

    def close(self) -> None:
        """Close both connections, ignoring errors."""
        ...

    def close_work(self) -> None:
        """Close the work connection only, ignoring errors."""
        ...

    def listen_dead(self) -> bool:
        """Is the listen connection (the one holding the lock) gone or broken?"""
        ...

    def work_dead(self) -> bool:
        """Is the work connection gone or broken?"""
        ...

    def listen_fileno(self) -> int:
        """Socket of the listen connection, for the selector."""
        ...

    def listen_pid(self) -> int:
        """Server process id of the listen connection (the lock's holder)."""
        ...

    def dbname(self) -> str:
        """Name of the database connected to (for messages)."""
        ...

    def role(self) -> str:
        """The role the sessions log in as (for messages; "?" when not connected)."""
        ...

    # -- the lock and LISTEN ------------------------------------------------------
    def try_lock(self) -> bool:
        """Take the advisory lock (shared in competing mode) on the listen connection."""
        ...

    def lock_holders(self) -> str:
        """Who holds the database, for the "already served" message (best effort)."""
        ...

    def lock_pids(self) -> set[int]:
        """Server process ids of the sessions holding the dispatcher lock."""
        ...

    def terminate_backend(self, pid: int) -> bool:
        """``pg_terminate_backend(pid)`` (our own old session)."""
        ...

    def start_listening(self) -> None:
        """LISTEN on the channels (on the listen connection)."""
        ...

    def notifications(self) -> list[str]:
        """Drain pending notifications without blocking: their channels, or
        :data:`DELAYED`, or :data:`TRY_NOW` and a stage."""
        ...

    def ping_listen(self) -> None:
        """A trivial statement on the listen connection, so a dead link shows up."""
        ...

    # -- registration and the heartbeat -------------------------------------------
    def schema_version(self) -> str | None:
        """``pepsi.schema_version()``: the alembic revision(s) of the database."""
        ...

    def register(self) -> int:
        """``pepsi.register_dispatcher`` → our dispatcher id."""
        ...

    def registered(self, dispatcher_id: int) -> bool:
        """Is our registration still there (competing: not declared dead)?"""
        ...

    def unregister(self, dispatcher_id: int) -> None:
        """``pepsi.unregister_dispatcher``."""
        ...

    def heartbeat(self, dispatcher_id: int, gauges: dict[str, Any] | None = None) -> None:
        """``pepsi.heartbeat``, with the gauges when given."""
        ...

    def register_stages(self, dispatcher_id: int, stages: Iterable[StageConfig]) -> None:
        """``pepsi.register_stages``: the stage table into pepsi.stages."""
        ...

    def overlay(self) -> list[tuple[str, str, str]]:
        """The ``[stage-*]`` rows of ``pepsi.config`` (``pepsi.stage_config``)."""
        ...

    def reset_orphans(self, dispatcher_id: int, orphan_timeout: float) -> int:
        """``pepsi.reset_orphans`` → rows put back to pending."""
        ...

    def replicas_away(
        self, dispatcher_id: int, orphan_timeout: float
    ) -> list[tuple[int, str, int]]:
        """``pepsi.replicas_away``: (id, hostname, pid) of the replicas that last
        heartbeated before the server restarted, have no session, and are younger
        than ``orphan_timeout`` (claims wait for them)."""
        ...

    def keep_dead_letters(self, batch: int) -> int:
        """``pepsi.keep_dead_letters``: one batch of kept failed rows moved out."""
        ...

    def purge_done(self, retention: float, batch: int) -> int:
        """``pepsi.purge_done``: one batch of old done rows deleted."""
        ...

    def flush_stats(
        self, deltas: dict[str, Any], gauges: tuple[int, dict[str, Any]] | None = None
    ) -> None:
        """``pepsi.flush_stats`` with ``deltas`` (``Stats.flush_args``); with
        ``gauges`` (dispatcher id, gauges) ``pepsi.heartbeat`` in the same statement."""
        ...

    # -- schedules ----------------------------------------------------------------
    def register_schedules(self, params: RegisterSchedulesParams) -> dict[str, datetime | None]:
        """``pepsi.register_schedules``: each schedule's settled-through time, by name."""
        ...

    def fire_schedule(self, params: FireScheduleParams) -> list[FiredTick]:
        """``pepsi.fire_schedule``; raises LockNotAvailable after 200 ms behind a lock."""
        ...

    # -- rows held ------------------------------------------------------------------
    def release(self, dispatcher_id: int, ids: Sequence[int] | None) -> int:
        """``pepsi.release``: held rows (all when ``ids`` is None) back to pending."""
        ...

    def held(self, dispatcher_id: int) -> set[int]:
        """Ids of the running rows the database says this dispatcher holds."""
        ...

    def stages_of(self, ids: Iterable[int]) -> dict[int, str]:
        """Current stage of each of ``ids`` (missing rows left out)."""
        ...

    # -- one wake's round trip, and its parts one statement each ----------------------
    def round_trip(self, dispatcher_id: int, params: RoundTripParams) -> RoundTripResult:
        """One wake's writes and claim, all or nothing; failures and checks first,
        so the claim never sees a row still settling."""
        ...

    def record_errors(self, dispatcher_id: int, failures: Sequence[Failure]) -> int:
        """``pepsi.record_dispatch_error`` alone."""
        ...

    def check_answered(self, dispatcher_id: int, ids: Sequence[int]) -> list[tuple[int, str]]:
        """``pepsi.check_answered`` alone: the rows failed for being left running."""
        ...

    def requeue_due(self, params: RequeueParams) -> Requeue:
        """``pepsi.requeue_due`` alone."""
        ...

    def claim(self, dispatcher_id: int, params: ClaimParams) -> ClaimedRows:
        """The claim alone."""
        ...


__all__ = [
    "CONNECTION_LOST",
    "LockBusy",
    "NotPermitted",
    "SCHEMA_MISSING",
    "StoreError",
    "StoreUnreachable",
    "DELAYED",
    "TRY_NOW",
    "ClaimParams",
    "ClaimedRows",
    "DispatchStore",
    "Epoch",
    "Failure",
    "FireScheduleParams",
    "FiredTick",
    "RegisterSchedulesParams",
    "Requeue",
    "RequeueParams",
    "RoundTripParams",
    "RoundTripResult",
]
