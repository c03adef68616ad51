"""Every statement of the PostgreSQL store binds its named parameters (no database).

The store's methods run against a connection that only converts each statement
the way psycopg does before sending it (``%(name)s`` to ``$n``, a missing name
raising), so a misspelt parameter fails here rather than in production, and the
hot path's statements are pinned as the server receives them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import psycopg
from psycopg._queries import PostgresQuery  # the conversion psycopg applies when it sends
from psycopg.adapt import Transformer

from pepsi_dispatch.config import load_config
from pepsi_dispatch.coordinator.database.port import (
    ClaimParams,
    FireScheduleParams,
    RegisterSchedulesParams,
    RequeueParams,
    RoundTripParams,
)
from pepsi_dispatch.coordinator.database.postgres import PostgresStore

#: One row that every decoder of the store accepts (a scalar 1; requeue_due's
#: columns with nothing due).
ROW = (1, 1, 1, None, None, None, None, None)


class Cursor:
    def fetchone(self) -> tuple[Any, ...]:
        return ROW

    def fetchall(self) -> list[Any]:
        return []


class Converting:
    """A connection that converts what it is given, as psycopg does, and keeps it."""

    closed = broken = False

    def __init__(self) -> None:
        self.sent: list[str] = []

    def execute(self, sql: str, params: Any = None) -> Cursor:
        query = PostgresQuery(Transformer())
        query.convert(sql, params)  # raises for a name the params lack
        self.sent.append(query.query.decode())
        return Cursor()

    @contextmanager
    def pipeline(self) -> Iterator[None]:
        yield


def store(competing: bool = False) -> tuple[PostgresStore, Converting]:
    db = PostgresStore("postgresql:///none", competing)
    conn = Converting()
    db.work = db.listen = cast("psycopg.Connection[Any]", conn)  # stands in for psycopg's
    return db, conn


def test_every_query_binds_its_named_parameters(tmp_path: Path) -> None:
    conf = tmp_path / "pepsi.conf"
    conf.write_text("[stage-a]\nPROGRAM = /bin/true\n")
    stages = load_config(str(conf)).stages.values()
    now = datetime(2026, 12, 1, tzinfo=UTC)
    claim = ClaimParams(["a"], [4], [None], [4096])
    for competing in (False, True):
        db, conn = store(competing)
        db.try_lock()
        db.lock_pids()
        db.terminate_backend(99)
        db.register()
        db.registered(7)
        db.heartbeat(7)
        db.heartbeat(7, {"workers": 1})
        db.schema_version()
        db.register_stages(7, stages)
        db.reset_orphans(7, 300.0)
        db.release(7, [1, 2])
        db.release(7, None)
        db.requeue_due(RequeueParams(None))
        db.purge_done(86400.0, 1000)
        db.keep_dead_letters(1000)
        db.register_schedules(RegisterSchedulesParams(["s"], ["a"], ["* * * * *"], [now]))
        db.fire_schedule(FireScheduleParams("s", [now], "a", {}, 0, None, now))
        arrays = ("stages", "processed", "failed", "timeouts", "crashes", "seconds")
        deltas: dict[str, Any] = {k: [] for k in arrays}
        deltas |= {"stage_runs": 0, "messages": 0, "requeued": 0, "expired": 0}
        db.flush_stats(deltas)
        db.flush_stats(deltas, (7, {}))
        db.held(7)
        db.stages_of([1])
        db.record_errors(7, [(1, "failed", "x")])
        db.check_answered(7, [1])
        db.claim(7, claim)
        db.round_trip(7, RoundTripParams([], [], None, claim))
        db.round_trip(7, RoundTripParams([], [1], None, claim))
        db.round_trip(7, RoundTripParams([(1, "failed", "x")], [2], RequeueParams(60.0), claim))
        assert len(conn.sent) == 30 and not any("%(" in s for s in conn.sent)


def test_the_claim_reaches_the_server_as_a_positional_statement() -> None:
    """The claim and the checks-and-claim statement, as the server receives them:
    the parameters in the order the function takes them; the checks' and the
    claim's dispatcher id are one parameter."""
    db, conn = store()
    claim = ClaimParams(["a"], [4], None)
    db.round_trip(7, RoundTripParams([], [], None, claim))
    db.round_trip(7, RoundTripParams([], [1], None, claim))
    alone, checked = conn.sent
    calls = (
        "pepsi.claim_lines($1::bigint, $2::text[], $3::int[], $4::boolean, $5::bigint[], $6::int[])"
    )
    assert calls in alone and "synchronous_commit" in alone
    assert "pepsi.check_answered($1::bigint, $2::bigint[])" in checked
    assert "pepsi.claim_lines($1::bigint, $3::text[], $4::int[], $5::boolean," in checked
