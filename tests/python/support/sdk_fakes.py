"""Stand-ins shared by the SDK unit tests (tests/python/unit/test_sdk_*.py): fake
connections, cursors and transactions, a recording scope, and small builders."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import psycopg

from pepsi_dispatch.sdk.ahead import WITH_ROWS
from pepsi_dispatch.sdk.connection import ConnectionHolder
from pepsi_dispatch.sdk.loading import GET_MESSAGES
from pepsi_dispatch.sdk.routing import HandlerDispatch, StageGraph
from pepsi_dispatch.sdk.runner import StageRunner
from pepsi_dispatch.sdk.statements import (
    ADVANCE_MANY,
    FINISH_MANY,
    MANY,
    Statement,
    Statements,
)
from pepsi_dispatch.sdk.transaction import (
    CommitMode,
    Role,
)


class FakeCursor:
    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows


class FakeTx:
    def __init__(self, conn: FakeConn) -> None:
        self.conn = conn

    def __enter__(self) -> FakeTx:
        self.conn.log.append("begin")
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        self.conn.log.append("commit" if kind is None else "rollback")


class FakeConn:
    """Records what is sent; every call returns ``result`` (one row per array element)."""

    def __init__(self, result: bool = True) -> None:
        self.log: list[Any] = []
        self.result = result
        self.broken = False
        self.info = SimpleNamespace(transaction_status=psycopg.pq.TransactionStatus.IDLE)

    def transaction(self) -> FakeTx:
        return FakeTx(self)

    @contextmanager
    def pipeline(self) -> Iterator[None]:
        self.log.append("pipeline")
        yield
        self.log.append("sync")

    def execute(self, sql: str, params: Any = None) -> FakeCursor:
        self.log.append((sql, params))
        if sql in (FINISH_MANY, ADVANCE_MANY):  # the ids it changed
            return FakeCursor([(i,) for i in params[0]] if self.result else [])
        if sql in MANY.values():
            return FakeCursor([(self.result,)] * len(params[0]))
        return FakeCursor([(self.result,)])


def stmt(kind: str, message_id: int, lost: str = "") -> Statement:
    return Statement(kind, (message_id, "a", None), lost or f"lost {message_id}")


def advance(message_id: int, to: str = "b", dispatcher: int | None = None) -> Statement:
    return Statement("advance", (message_id, "a", to, dispatcher), f"lost {message_id}")


GRAPH = StageGraph({"a": ("b", "c"), "b": ("c",), "c": ()}, "test.conf")


def make_runner(input_fd: int) -> StageRunner:
    dispatch = HandlerDispatch({}, "a", GRAPH, Statements(None))
    holder = ConnectionHolder(FakeConn())
    return StageRunner(dispatch, holder, CommitMode.PER_MESSAGE, -1, input_fd)


class RecordingScope:
    """A Scope as HandlerDispatch sees it: records statements with their role."""

    def __init__(self) -> None:
        self.conn = FakeConn()
        self.mode = CommitMode.PER_MESSAGE
        self.depth = 0
        self.written: list[tuple[str, tuple[Any, ...], Role]] = []
        self.events: list[str] = []

    def write(self, statement: Statement, role: Role) -> None:
        self.written.append((statement.kind, statement.params, role))

    def push(self) -> None:
        self.depth += 1

    def enter(self) -> None:
        if not self.depth:
            self.push()

    def rollback_to(self, depth: int) -> None:
        self.events.append(f"rollback_to {depth}")
        self.depth = min(self.depth, depth)

    def commit(self) -> None:
        self.events.append("commit")
        self.depth = 0

    def ended(self) -> bool:
        """The transaction ended under the message (a handler's COMMIT): never here."""
        return False


def row(stage: str = "a", status: str = "running", state: Any = None) -> tuple[Any, ...]:
    return (1, stage, status, {"p": 1}, state, 0)


def dispatch(handlers: dict[str, Any], retry: frozenset[str] = frozenset()) -> HandlerDispatch:
    return HandlerDispatch(handlers, "a", GRAPH, Statements(5), retry)


class RowsConn(FakeConn):
    """A FakeConn that answers get_messages (alone, or after a call: WITH_ROWS) with
    a running row per id; ``fail_ahead``: the combined statement raises (the
    connection stays fine)."""

    def __init__(self, result: bool = True, fail_ahead: bool = False) -> None:
        super().__init__(result)
        self.fail_ahead = fail_ahead
        # What row lines are decoded with (sdk/loading.py): psycopg's own jsonb loader.
        self.info.encoding = "utf-8"
        self.adapters = psycopg.adapters
        self.connection = None

    def execute(self, sql: str, params: Any = None) -> FakeCursor:
        if sql == GET_MESSAGES:
            self.log.append((sql, params))
            return FakeCursor([(i, "a", "running", {}, {}, 0) for i in params[0]])
        if sql.endswith(WITH_ROWS.format("")):
            self.log.append(("with_rows", sql.removesuffix(WITH_ROWS.format("")), params))
            if self.fail_ahead:
                raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
            rows = [(None, i, "a", "running", {}, {}, 0) for i in params[-1]]
            return FakeCursor([(self.result, None, None, None, None, None, None), *rows])
        return super().execute(sql, params)
