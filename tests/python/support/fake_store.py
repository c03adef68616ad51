"""A typed fake of the coordinator's database port (``DispatchStore``), for the
unit tests: no PostgreSQL, every call recorded in order, every answer set by
the test.

It implements every member of the port with the port's signatures
(tests/python/unit/test_store_port.py compares them), so a test passes it
wherever the coordinator takes a ``DispatchStore``, without ``type: ignore``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from pepsi_dispatch.config import StageConfig
from pepsi_dispatch.coordinator.database.port import (
    ClaimedRows,
    ClaimParams,
    DispatchStore,
    Epoch,
    Failure,
    FiredTick,
    FireScheduleParams,
    RegisterSchedulesParams,
    Requeue,
    RequeueParams,
    RoundTripParams,
    RoundTripResult,
)


class FakeStore:
    """The database port in memory. Attributes set what the calls answer;
    ``calls`` lists the methods called, in order; ``fail[name]`` is raised by
    the next call of that method (and stays until removed)."""

    def __init__(
        self,
        *,
        competing: bool = False,
        server_epoch: Epoch | None = None,
        schema_version: str | None = None,
    ) -> None:
        self.competing = competing
        self.server_epoch = server_epoch
        #: pepsi.schema_version()'s answer (the test sets the floor or an older one)
        self.version = schema_version
        #: both connections up (False: DatabaseLink.lost sees them broken)
        self.connections_up = True
        #: try_lock's answer, and who holds the lock when it is refused
        self.lock = True
        self.holders = "dispatcher 1"
        #: register's answer; reset_orphans' and release's counts
        self.dispatcher_id = 7
        self.orphans_reset = 0
        #: replicas_away's answer: (id, hostname, pid) of the replicas claims wait for
        self.away: list[tuple[int, str, int]] = []
        self.released_count = 2
        #: the overlay rows (section, option, value); notifications to drain
        self.overlay_rows: list[tuple[str, str, str]] = []
        self.notes: list[str] = []
        #: register_schedules: every schedule settled through this time
        self.settled: datetime | None = None
        #: what the round trip and the claim return (nothing claimed by default)
        self.round_trip_result = RoundTripResult([], None, [])
        self.claimed = ClaimedRows([], [], {})
        self.calls: list[str] = []
        self.fail: dict[str, BaseException] = {}
        #: the arguments of the writes, by kind
        self.released: list[tuple[int, Sequence[int] | None]] = []
        self.flushed: list[dict[str, Any]] = []
        self.gauges: list[tuple[int, dict[str, Any]] | None] = []
        self.heartbeats: list[tuple[int, dict[str, Any] | None]] = []
        self.fired: list[FireScheduleParams] = []
        self.round_trips: list[RoundTripParams] = []
        self.stage_tables: list[list[str]] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise self.fail[name]

    # -- connections -----------------------------------------------------------------
    def connect(self) -> None:
        self._call("connect")

    def connect_work(self) -> None:
        self._call("connect_work")

    def close(self) -> None:
        self.calls.append("close")

    def close_work(self) -> None:
        self.calls.append("close_work")

    def listen_dead(self) -> bool:
        return not self.connections_up

    def work_dead(self) -> bool:
        return not self.connections_up

    def listen_fileno(self) -> int:
        return -1

    def listen_pid(self) -> int:
        return 4242

    def dbname(self) -> str:
        return "fake"

    def role(self) -> str:
        return "dispatcher_role"

    # -- the lock and LISTEN -------------------------------------------------------------
    def try_lock(self) -> bool:
        self._call("try_lock")
        return self.lock

    def lock_holders(self) -> str:
        self._call("lock_holders")
        return self.holders

    def lock_pids(self) -> set[int]:
        self._call("lock_pids")
        return set()

    def terminate_backend(self, pid: int) -> bool:
        self._call("terminate_backend")
        return True

    def start_listening(self) -> None:
        self._call("start_listening")

    def notifications(self) -> list[str]:
        self._call("notifications")
        notes, self.notes = self.notes, []
        return notes

    def ping_listen(self) -> None:
        self._call("ping_listen")

    # -- registration and the heartbeat ------------------------------------------------
    def schema_version(self) -> str | None:
        self._call("schema_version")
        return self.version

    def register(self) -> int:
        self._call("register")
        return self.dispatcher_id

    def registered(self, dispatcher_id: int) -> bool:
        self._call("registered")
        return True

    def unregister(self, dispatcher_id: int) -> None:
        self._call("unregister")

    def heartbeat(self, dispatcher_id: int, gauges: dict[str, Any] | None = None) -> None:
        self._call("heartbeat")
        self.heartbeats.append((dispatcher_id, gauges))

    def register_stages(self, dispatcher_id: int, stages: Iterable[StageConfig]) -> None:
        self._call("register_stages")
        self.stage_tables.append([s.name for s in stages])

    def overlay(self) -> list[tuple[str, str, str]]:
        self._call("overlay")
        return list(self.overlay_rows)

    def reset_orphans(self, dispatcher_id: int, orphan_timeout: float) -> int:
        self._call("reset_orphans")
        return self.orphans_reset

    def replicas_away(
        self, dispatcher_id: int, orphan_timeout: float
    ) -> list[tuple[int, str, int]]:
        self._call("replicas_away")
        return list(self.away)

    def keep_dead_letters(self, batch: int) -> int:
        self._call("keep_dead_letters")
        return 0

    def purge_done(self, retention: float, batch: int) -> int:
        self._call("purge_done")
        return 0

    def flush_stats(
        self, deltas: dict[str, Any], gauges: tuple[int, dict[str, Any]] | None = None
    ) -> None:
        self._call("flush_stats")
        self.flushed.append(deltas)
        self.gauges.append(gauges)

    # -- schedules -----------------------------------------------------------------------
    def register_schedules(self, params: RegisterSchedulesParams) -> dict[str, datetime | None]:
        self._call("register_schedules")
        return {name: self.settled for name in params.names}

    def fire_schedule(self, params: FireScheduleParams) -> list[FiredTick]:
        """Every tick enqueued, as message 0, 1, ..."""
        self._call("fire_schedule")
        self.fired.append(params)
        return [(t, i, True) for i, t in enumerate(params.ticks)]

    # -- rows held -----------------------------------------------------------------------
    def release(self, dispatcher_id: int, ids: Sequence[int] | None) -> int:
        self._call("release")
        self.released.append((dispatcher_id, ids))
        return self.released_count

    def held(self, dispatcher_id: int) -> set[int]:
        self._call("held")
        return set()

    def stages_of(self, ids: Iterable[int]) -> dict[int, str]:
        self._call("stages_of")
        return {}

    # -- one wake's round trip, and its parts ----------------------------------------------
    def round_trip(self, dispatcher_id: int, params: RoundTripParams) -> RoundTripResult:
        self._call("round_trip")
        self.round_trips.append(params)
        return self.round_trip_result

    def record_errors(self, dispatcher_id: int, failures: Sequence[Failure]) -> int:
        self._call("record_errors")
        return len(failures)

    def check_answered(self, dispatcher_id: int, ids: Sequence[int]) -> list[tuple[int, str]]:
        self._call("check_answered")
        return []

    def requeue_due(self, params: RequeueParams) -> Requeue:
        self._call("requeue_due")
        return Requeue(0, 0, 0, None)

    def claim(self, dispatcher_id: int, params: ClaimParams) -> ClaimedRows:
        self._call("claim")
        return self.claimed


def as_port(store: FakeStore) -> DispatchStore:
    """The fake where a ``DispatchStore`` is expected (a type checker checks that
    it conforms; test_store_port.py checks it at run time)."""
    return store


__all__ = ["FakeStore", "as_port"]
