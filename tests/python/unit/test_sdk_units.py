"""Unit tests of the SDK's parts (pepsi_dispatch/sdk/) that need no database.

The pure logic pulled out of the old worker.py: how a statement is sent
(call_mode), group commit's bookkeeping (plan_flush, GroupBatch), the statements
a transition becomes, the graph checks, the state patch, the pipe's line reader,
the runner's states, and handler dispatch against a recording scope. The SDK
end to end (a real database, a real process) is tests/python/integration/test_worker_sdk.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

from pepsi_dispatch.sdk import runner as runner_mod
from pepsi_dispatch.sdk.ahead import WITH_ROWS, ReadAhead
from pepsi_dispatch.sdk.connection import ConnectionHolder
from pepsi_dispatch.sdk.loading import GET_MESSAGES, Loaded
from pepsi_dispatch.sdk.message import Advance, Fail, Finish, Message, Pause, Refused
from pepsi_dispatch.sdk.pipe import (
    MAX_REASON,
    LineReader,
    exc_reason,
    one_line,
    parse_id,
    write_answers,
)
from pepsi_dispatch.sdk.routing import Attempt, HandlerDispatch, StageGraph, state_patch
from pepsi_dispatch.sdk.runner import RunnerState, StageRunner
from pepsi_dispatch.sdk.statements import (
    ADVANCE_MANY,
    FINISH_MANY,
    MANY,
    SINGLE,
    Statement,
    Statements,
)
from pepsi_dispatch.sdk.transaction import (
    BatchFailed,
    CallMode,
    CommitMode,
    Deferred,
    GroupBatch,
    Role,
    RowLost,
    Scope,
    call_mode,
    columns,
    plan_flush,
)
from pepsi_dispatch.sdk.transaction import one_call_params as advance_many_params
from pepsi_dispatch.sdk.transaction import one_call_params as finish_many_params

# --------------------------------------------------------------------------- call modes


@pytest.mark.parametrize(
    ("commit", "depth", "role", "mode"),
    [
        (CommitMode.PER_MESSAGE, 0, Role.LAST, CallMode.AUTOCOMMIT),
        (CommitMode.PER_MESSAGE, 0, Role.STEP, CallMode.IN_TRANSACTION),
        (CommitMode.PER_MESSAGE, 1, Role.LAST, CallMode.IN_TRANSACTION),
        (CommitMode.PER_MESSAGE, 1, Role.STEP, CallMode.IN_TRANSACTION),
        (CommitMode.GROUP, 0, Role.LAST, CallMode.DEFERRED),
        (CommitMode.GROUP, 0, Role.STEP, CallMode.DEFERRED),
        (CommitMode.GROUP, 1, Role.LAST, CallMode.IN_TRANSACTION),
        (CommitMode.GROUP, 2, Role.STEP, CallMode.IN_TRANSACTION),
    ],
)
def test_call_mode(commit: CommitMode, depth: int, role: Role, mode: CallMode) -> None:
    assert call_mode(commit, depth, role) is mode


# --------------------------------------------------------------------------- a fake connection


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


# --------------------------------------------------------------------------- group commit


def test_plan_flush_groups_by_position_then_kind_and_keeps_each_message_in_order() -> None:
    deferred = [
        Deferred(stmt("set_state", 1), 0),
        Deferred(stmt("advance", 1), 0),
        Deferred(stmt("finish", 2), 1),
        Deferred(stmt("set_state", 3), 2),
        Deferred(stmt("hop", 3), 2),
        Deferred(stmt("advance", 3), 2),
    ]
    plan = plan_flush(deferred)
    assert [(kind, [d.slot for d in items]) for kind, items in plan] == [
        ("finish", [1]),
        ("set_state", [0, 2]),
        ("advance", [0]),
        ("hop", [2]),
        ("advance", [2]),
    ]
    for slot in (0, 1, 2):  # each message's statements in the order it wrote them
        sent = [d.statement.kind for _, items in plan for d in items if d.slot == slot]
        assert sent == [d.statement.kind for d in deferred if d.slot == slot]


def test_columns_are_parallel_arrays() -> None:
    items = [Deferred(stmt("finish", 1), 0), Deferred(stmt("finish", 2), 1)]
    assert columns(items) == ([1, 2], ["a", "a"], [None, None])


def test_group_batch_defers_forgets_and_notes_the_first_loss() -> None:
    batch = GroupBatch(FakeConn())
    batch.slot = 0
    batch.defer(stmt("set_state", 1, "a lost"))
    batch.defer(stmt("finish", 1, "b lost"))
    batch.slot = 1
    batch.defer(stmt("finish", 2))
    batch.forget(1)
    assert [d.slot for d in batch.deferred] == [0, 0]
    batch.note_results(batch.deferred, [False, False])
    assert batch.lost == {0: "a lost"}


def test_group_batch_flush_sends_one_pipeline_single_or_over_arrays() -> None:
    conn = FakeConn(result=False)
    batch = GroupBatch(conn)
    for slot, message_id in enumerate((1, 2)):
        batch.slot = slot
        batch.defer(stmt("finish", message_id))
    batch.slot = 2
    batch.defer(stmt("fail", 3))
    batch.flush()
    assert conn.log[0] == "pipeline" and conn.log[-1] == "sync"
    assert conn.log[1] == (SINGLE["fail"], (3, "a", None))
    # finishes of one stage go through pepsi.finish_many: one set-based UPDATE
    assert conn.log[2] == (FINISH_MANY, ([1, 2], "a", None))
    assert batch.lost == {0: "lost 1", 1: "lost 2", 2: "lost 3"}
    assert batch.deferred == []
    batch.flush()  # nothing deferred: nothing sent
    assert len(conn.log) == 4


def test_finish_many_reports_each_id_it_did_not_change_as_lost() -> None:
    class SomeFinished(FakeConn):
        def execute(self, sql: str, params: Any) -> FakeCursor:
            self.log.append((sql, params))
            return FakeCursor([(2,)])  # of ids 1, 2, 3 only 2 was still ours

    batch = GroupBatch(SomeFinished())
    for slot, message_id in enumerate((1, 2, 3)):
        batch.slot = slot
        batch.defer(stmt("finish", message_id))
    batch.flush()
    assert batch.lost == {0: "lost 1", 2: "lost 3"}


def test_finish_many_only_for_one_stage_one_dispatcher_and_distinct_ids() -> None:
    def items(*params: tuple[Any, ...]) -> list[Deferred]:
        return [Deferred(Statement("finish", p, "lost"), n) for n, p in enumerate(params)]

    assert finish_many_params(items((1, "a", 7), (2, "a", 7))) == ([1, 2], "a", 7)
    assert finish_many_params(items((1, "a", 7), (2, "b", 7))) is None  # after a fused hop
    assert finish_many_params(items((1, "a", 7), (2, "a", 8))) is None
    assert finish_many_params(items((1, "a", 7), (1, "a", 7))) is None  # one id twice


def test_finish_of_several_stages_or_a_repeated_id_goes_row_by_row() -> None:
    conn = FakeConn(result=False)
    batch = GroupBatch(conn)
    for slot, message_id in enumerate((4, 4)):
        batch.slot = slot
        batch.defer(stmt("finish", message_id))
    batch.flush()
    assert conn.log[1] == (MANY["finish"], ([4, 4], ["a", "a"], [None, None]))
    assert batch.lost == {0: "lost 4", 1: "lost 4"}


def advance(message_id: int, to: str = "b", dispatcher: int | None = None) -> Statement:
    return Statement("advance", (message_id, "a", to, dispatcher), f"lost {message_id}")


def test_advances_of_one_stage_to_one_stage_go_through_advance_many() -> None:
    conn = FakeConn(result=False)
    batch = GroupBatch(conn)
    for slot, message_id in enumerate((1, 2, 3)):
        batch.slot = slot
        batch.defer(advance(message_id))
    batch.flush()
    # one set-based UPDATE, not pepsi.advance per row over unnest
    assert conn.log == ["pipeline", (ADVANCE_MANY, ([1, 2, 3], "a", "b", None)), "sync"]
    assert batch.lost == {0: "lost 1", 1: "lost 2", 2: "lost 3"}


def test_advance_many_reports_each_id_it_did_not_change_as_lost() -> None:
    class SomeAdvanced(FakeConn):
        def execute(self, sql: str, params: Any) -> FakeCursor:
            self.log.append((sql, params))
            return FakeCursor([(3,), (1,)])  # of ids 1, 2, 3 only 1 and 3 were still ours

    conn = SomeAdvanced()
    batch = GroupBatch(conn)
    for slot, message_id in enumerate((1, 2, 3)):
        batch.slot = slot
        batch.defer(advance(message_id, dispatcher=7))
    batch.flush()
    assert conn.log[1] == (ADVANCE_MANY, ([1, 2, 3], "a", "b", 7))
    assert batch.lost == {1: "lost 2"}


def test_advance_many_only_for_one_stage_one_target_one_dispatcher_and_distinct_ids() -> None:
    def items(*params: tuple[Any, ...]) -> list[Deferred]:
        return [Deferred(Statement("advance", p, "lost"), n) for n, p in enumerate(params)]

    assert advance_many_params(items((1, "a", "b", 7), (2, "a", "b", 7))) == (
        [1, 2],
        "a",
        "b",
        7,
    )
    assert advance_many_params(items((1, "a", "b", 7), (2, "x", "b", 7))) is None  # fused hop
    assert advance_many_params(items((1, "a", "b", 7), (2, "a", "c", 7))) is None
    assert advance_many_params(items((1, "a", "b", 7), (2, "a", "b", 8))) is None
    assert advance_many_params(items((1, "a", "b", 7), (1, "a", "b", 7))) is None  # one id twice


def test_advances_to_several_stages_or_a_repeated_id_go_row_by_row() -> None:
    conn = FakeConn(result=True)
    batch = GroupBatch(conn)
    for slot, (message_id, to) in enumerate(((4, "b"), (5, "c"), (4, "b"))):
        batch.slot = slot
        batch.defer(advance(message_id, to))
    batch.flush()
    assert conn.log[1] == (
        MANY["advance"],
        ([4, 5, 4], ["a", "a", "a"], ["b", "c", "b"], [None, None, None]),
    )
    assert batch.lost == {}


# --------------------------------------------------------------------------- scopes


def test_scope_lone_last_statement_runs_without_a_transaction() -> None:
    conn = FakeConn()
    scope = Scope(conn)
    scope.write(stmt("finish", 1), Role.LAST)
    assert conn.log == [(SINGLE["finish"], (1, "a", None))]


def test_scope_step_opens_a_transaction_that_commit_closes() -> None:
    conn = FakeConn()
    scope = Scope(conn)
    scope.write(stmt("set_state", 1), Role.STEP)
    scope.write(stmt("finish", 1), Role.LAST)
    assert scope.depth == 1
    scope.commit()
    assert [e if isinstance(e, str) else e[0] for e in conn.log] == [
        "begin",
        SINGLE["set_state"],
        SINGLE["finish"],
        "commit",
    ]


def test_scope_raises_row_lost_when_the_call_changed_nothing() -> None:
    scope = Scope(FakeConn(result=False))
    with pytest.raises(RowLost, match="lost 7"):
        scope.write(stmt("finish", 7), Role.LAST)


def test_group_scope_defers_until_a_level_opens_then_flushes_first() -> None:
    conn = FakeConn()
    batch = GroupBatch(conn)
    scope = Scope(conn, CommitMode.GROUP, batch)
    scope.write(stmt("set_state", 1), Role.STEP)
    assert conn.log == [] and len(batch.deferred) == 1
    scope.push()  # e.g. msg.db: the batch begins, the deferred statements go before the savepoint
    assert conn.log[:4] == ["begin", "pipeline", (SINGLE["set_state"], (1, "a", None)), "sync"]
    assert conn.log[4] == "begin"
    scope.write(stmt("finish", 1), Role.LAST)  # inside the savepoint now
    assert conn.log[5] == (SINGLE["finish"], (1, "a", None))
    scope.rollback_to(0)
    assert conn.log[-1] == "rollback"
    batch.commit()  # the batch's own transaction
    assert conn.log[-1] == "commit"


def test_group_batch_without_savepoints_commits_in_one_pipeline() -> None:
    conn = FakeConn()
    batch = GroupBatch(conn)
    for slot, message_id in enumerate((1, 2)):
        batch.slot = slot
        Scope(conn, CommitMode.GROUP, batch).write(stmt("finish", message_id), Role.LAST)
    assert conn.log == []
    batch.commit()
    assert conn.log == [
        "pipeline",
        ("BEGIN", None),
        (FINISH_MANY, ([1, 2], "a", None)),
        ("COMMIT", None),
        "sync",
    ]


def test_group_batch_that_fails_in_its_pipeline_rolls_back_and_fails_the_batch() -> None:
    class Failing(FakeConn):
        @contextmanager
        def pipeline(self) -> Iterator[None]:
            self.log.append("pipeline")
            yield
            self.info.transaction_status = psycopg.pq.TransactionStatus.INERROR
            raise psycopg.errors.DivisionByZero("boom")

    conn = Failing()
    batch = GroupBatch(conn)
    batch.defer(stmt("finish", 1))
    with pytest.raises(BatchFailed, match="boom"):
        batch.commit()
    assert conn.log[-1] == ("ROLLBACK", None)  # the BEGIN of the pipeline is undone


def test_group_scope_needs_its_batch() -> None:
    with pytest.raises(ValueError):
        Scope(FakeConn(), CommitMode.GROUP)


def test_connection_holder_without_connect_cannot_reconnect() -> None:
    import psycopg

    holder = ConnectionHolder(FakeConn(), None, timeout=0)
    with pytest.raises(psycopg.OperationalError, match="no way to reconnect"):
        holder.reconnect()


# --------------------------------------------------------------------------- statements


def test_statements_of_each_transition() -> None:
    s = Statements(9)
    assert s.transition(1, "a", Advance("b")) == Statement(
        "advance", (1, "a", "b", 9), s.lost(1, "a", "advance")
    )
    assert s.transition(1, "a", Finish()).params == (1, "a", 9)
    at = datetime(2030, 1, 1, tzinfo=UTC)
    assert s.transition(1, "a", Pause(at, "r")).kind == "pause_at"
    assert s.transition(1, "a", Pause(at, "r")).params == (1, "a", at, "r", 9)
    assert s.transition(1, "a", Pause(timedelta(minutes=1))).params == (1, "a", 60.0, None, 9)
    assert s.transition(1, "a", Pause(5)).kind == "pause_in"
    fail = s.transition(1, "b", Fail("bad\nthing"), prefix="[b] ")
    assert fail.params == (1, "b", "[b] bad thing", 9)
    assert "pause of message 1" in s.transition(1, "a", Pause(1)).lost
    assert s.hop(1, "a", "b").params == (1, "a", "b", 9)
    assert s.set_state(1, "a", '{"k": 1}').kind == "set_state"


@pytest.mark.parametrize("when", ["soon", True, None])
def test_pause_needs_a_time(when: Any) -> None:
    with pytest.raises(Refused, match="Pause needs seconds"):
        Statements(None).transition(1, "a", Pause(when))


def test_lost_names_the_dispatcher_only_when_known() -> None:
    assert "under dispatcher 4" in Statements(4).lost(1, "a", "finish")
    assert "under dispatcher" not in Statements(None).lost(1, "a", "finish")


# --------------------------------------------------------------------------- graph and state


GRAPH = StageGraph({"a": ("b", "c"), "b": ("c",), "c": ()}, "test.conf")


def test_none_means_the_only_successor_or_finish() -> None:
    assert GRAPH.check("b", None) == Advance("c")
    assert GRAPH.check("c", None) == Finish()
    with pytest.raises(Refused, match="several successors"):
        GRAPH.check("a", None)
    with pytest.raises(Refused, match="not in the configuration"):
        GRAPH.check("x", None)


def test_advance_is_checked_against_next() -> None:
    assert GRAPH.check("a", Advance("c", fuse=True)) == Advance("c", fuse=True)
    with pytest.raises(Refused, match=r"allowed successors: c; NEXT of \[stage-b\]"):
        GRAPH.check("b", Advance("a"))
    with pytest.raises(Refused, match="c is a final stage"):
        GRAPH.check("c", Advance("a"))
    with pytest.raises(Refused, match="successors are unknown"):
        StageGraph(None, "none").check("a", Advance("b"))


def test_other_results() -> None:
    assert GRAPH.check("a", Fail("x")) == Fail("x")
    with pytest.raises(Refused, match="returned str, not a transition"):
        GRAPH.check("a", "bogus")


def test_state_patch() -> None:
    original = {"a": 1, "nested": [1]}
    assert state_patch(original, {"a": 1, "nested": [1]}) is None
    assert state_patch(original, {"a": 2, "nested": [1, 2], "new": None}) == (
        '{"a": 2, "nested": [1, 2], "new": null}'
    )
    assert state_patch({}, {"dispatch_error": "x"}) is None
    with pytest.raises(Refused, match="cannot be stored as JSON"):
        state_patch({}, {"bad": {1, 2}})


# --------------------------------------------------------------------------- the pipe


def test_one_line_and_exc_reason() -> None:
    assert one_line("a\n  b\tc") == "a b c"
    assert one_line("  ") == "failed"
    long = one_line("x" * (MAX_REASON + 10))
    assert len(long) == MAX_REASON and long.endswith("...")
    assert exc_reason(ValueError("bad\nvalue")) == "ValueError: bad value"
    assert exc_reason(KeyError()) == "KeyError"


def test_parse_id() -> None:
    assert parse_id(b" 42 \n") == 42
    assert parse_id(b"x") is None


def test_line_reader_batches_what_is_buffered_and_reads_a_last_line_at_eof() -> None:
    r, w = os.pipe()
    calls: list[str] = []
    reader = LineReader(r, lambda: calls.append("before"), lambda: calls.append("after"))
    os.write(w, b"1\n\n2\n3")
    assert reader.lines() == [b"1", b"2"]
    assert calls == ["before", "after"]
    os.write(w, b"4\n")
    assert reader.lines() == [b"34"]
    os.close(w)
    assert reader.lines() == []
    os.close(r)


def test_line_reader_unterminated_last_line_counts_at_eof() -> None:
    r, w = os.pipe()
    reader = LineReader(r, lambda: None, lambda: None)
    os.write(w, b"5")
    os.close(w)
    assert reader.lines() == [b"5"]
    assert reader.lines() == []
    os.close(r)


def test_write_answers() -> None:
    r, w = os.pipe()
    write_answers(w, ["0", "1 no"])
    assert os.read(r, 100) == b"0\n1 no\n"
    os.close(r)
    os.close(w)


# --------------------------------------------------------------------------- the runner's states


def make_runner(input_fd: int) -> StageRunner:
    dispatch = HandlerDispatch({}, "a", GRAPH, Statements(None))
    holder = ConnectionHolder(FakeConn())
    return StageRunner(dispatch, holder, CommitMode.PER_MESSAGE, -1, input_fd)


def test_runner_stop_signal_while_working_lets_the_message_finish() -> None:
    runner = make_runner(-1)
    assert runner.state is RunnerState.WORKING
    runner.on_signal(15, None)  # no exception: the message in hand goes on
    assert runner.state is RunnerState.STOPPING
    with pytest.raises(runner_mod._Stop):
        runner._before_read()  # the next read does not start


def test_runner_stop_signal_while_reading_stops_at_once() -> None:
    runner = make_runner(-1)
    runner._before_read()
    assert runner.state is RunnerState.READING
    with pytest.raises(runner_mod._Stop):
        runner.on_signal(15, None)
    assert runner.state is RunnerState.STOPPING


def test_runner_exits_0_at_eof_and_after_a_stop_before_reading() -> None:
    r, w = os.pipe()
    os.close(w)
    runner = make_runner(r)
    assert runner.serve() == 0
    os.close(r)
    stopped = make_runner(-1)  # would fail to read fd -1
    stopped.on_signal(2, None)
    assert stopped.serve() == 0


# --------------------------------------------------------------------------- handler dispatch


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


def row(stage: str = "a", status: str = "running", state: Any = None) -> tuple[Any, ...]:
    return (1, stage, status, {"p": 1}, state, 0)


def dispatch(handlers: dict[str, Any], retry: frozenset[str] = frozenset()) -> HandlerDispatch:
    return HandlerDispatch(handlers, "a", GRAPH, Statements(5), retry)


def test_lines_that_are_no_running_message_of_ours() -> None:
    d = dispatch({})
    scope = RecordingScope()
    assert d.process(Loaded(b"x y", None, None), scope) == "1 not a message id: x y"
    assert d.process(Loaded(b"1", 1, None), scope) == "1 message 1 does not exist"
    done = Loaded(b"1", 1, row("b", "done"))
    assert d.process(done, scope) == (
        "1 message 1 is not running at stage a (it is done at stage b)"
    )
    assert d.process(done, scope, Attempt.REDO) == "0"
    assert scope.written == []


def test_fused_pass_writes_state_hop_and_transition_in_order() -> None:
    seen: list[tuple[str, tuple[str, ...], int]] = []

    def a(msg: Message) -> Advance:
        seen.append((msg.stage, msg.fused_from, msg.retries))
        msg.state["x"] = 1
        return Advance("b", fuse=True)

    def b(msg: Message) -> None:
        seen.append((msg.stage, msg.fused_from, msg.retries))
        assert msg.state == {"x": 1}
        return None  # the only successor: c

    scope = RecordingScope()
    answer = dispatch({"a": a, "b": b}).process(Loaded(b"1", 1, row()), scope)
    assert answer == "0 fused=b"
    assert seen == [("a", (), 0), ("b", ("a",), 0)]
    assert [(k, p[2] if k != "set_state" else None, r) for k, p, r in scope.written] == [
        ("set_state", None, Role.STEP),
        ("hop", "b", Role.STEP),
        ("advance", "c", Role.LAST),
    ]
    assert scope.written[-1][1] == (1, "b", "c", 5)
    assert scope.events == ["commit"]


def test_handler_exception_fails_the_message_unless_the_stage_retries() -> None:
    def boom(msg: Message) -> None:
        raise ValueError("boom")

    scope = RecordingScope()
    answer = dispatch({"a": boom}).process(Loaded(b"1", 1, row()), scope)
    assert answer == "1 ValueError: boom"
    assert scope.written == [("fail", (1, "a", "ValueError: boom", 5), Role.LAST)]
    assert scope.events == ["rollback_to 0", "commit"]

    scope = RecordingScope()
    retried = dispatch({"a": boom}, frozenset({"a"}))
    assert retried.process(Loaded(b"1", 1, row()), scope) == "1 ValueError: boom"
    assert scope.written == []  # left running: the dispatcher retries it


def test_refused_transition_fails_even_at_a_retry_stage() -> None:
    scope = RecordingScope()
    d = dispatch({"a": lambda msg: Advance("d")}, frozenset({"a"}))
    answer = d.process(Loaded(b"1", 1, row()), scope)
    assert answer.startswith("1 stage a may not advance to d")
    assert [w[0] for w in scope.written] == ["fail"]


def test_fail_after_a_hop_is_prefixed_with_the_fused_stage() -> None:
    scope = RecordingScope()
    d = dispatch({"a": lambda msg: Advance("b", fuse=True), "b": lambda msg: Fail("no")})
    answer = d.process(Loaded(b"1", 1, row()), scope)
    assert answer == "1 [b] no"
    assert scope.written[-1] == ("fail", (1, "b", "[b] no", 5), Role.LAST)


def test_row_lost_rolls_back_and_answers_the_reason() -> None:
    class LosingScope(RecordingScope):
        def write(self, statement: Statement, role: Role) -> None:
            raise RowLost(statement.lost)

    scope = LosingScope()
    answer = dispatch({"a": lambda msg: Finish()}).process(Loaded(b"1", 1, row()), scope)
    assert answer.startswith("1 finish of message 1 changed nothing")
    assert scope.events == ["rollback_to 0"]


# --------------------------------------------------------------------------- the public path


def test_worker_module_is_the_stable_public_path() -> None:
    from pepsi_dispatch import worker
    from pepsi_dispatch.sdk import entry, message

    assert worker.__all__ == [
        "Advance",
        "Fail",
        "Finish",
        "Handler",
        "Message",
        "Pause",
        "Transition",
        "run",
    ]
    assert worker.run is entry.run and worker.Message is message.Message
    assert (worker.EX_TEMPFAIL, worker.MAX_REASON) == (75, 2000)
    assert worker.RECONNECT_TIMEOUT > 0


def test_message_db_outside_processing_raises() -> None:
    msg = Message(id=1, stage="a", payload={}, state={}, retries=0)
    with pytest.raises(RuntimeError, match="not being processed"):
        _ = msg.db


# --------------------------------------------------------------------------- read-ahead


class RowsConn(FakeConn):
    """A FakeConn that answers get_messages (alone, or after a call: WITH_ROWS) with
    a running row per id; ``fail_ahead``: the combined statement raises (the
    connection stays fine)."""

    def __init__(self, result: bool = True, fail_ahead: bool = False) -> None:
        super().__init__(result)
        self.fail_ahead = fail_ahead

    def execute(self, sql: str, params: Any) -> FakeCursor:
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


def test_read_ahead_rides_on_a_lone_transition_in_one_statement() -> None:
    """A message's lone autocommit transition carries get_messages for the lines
    waiting on stdin: one statement; the lines join the unanswered ones."""
    conn = RowsConn()
    unanswered = [b"1"]
    ahead = ReadAhead(lambda: [b"5", b"junk"], unanswered)
    Scope(conn, ahead=ahead).write(stmt("finish", 1), Role.LAST)  # type: ignore[arg-type]
    assert conn.log == [("with_rows", SINGLE["finish"], (1, "a", None, [5]))]
    assert unanswered == [b"1", b"5", b"junk"]
    loaded = ahead.take(conn)  # type: ignore[arg-type]
    assert [(item.line, item.message_id, item.row is not None) for item in loaded] == [
        (b"5", 5, True),
        (b"junk", None, False),
    ]
    assert len(conn.log) == 1 and ahead.take(conn) == []  # type: ignore[arg-type]


def test_read_ahead_never_reads_a_second_copy_of_an_id_in_hand() -> None:
    """A line for an id this worker still holds (here the message in hand) is
    not read in the same statement as its transition (that would see the row
    as it was before it): it is loaded after the commit."""
    conn = RowsConn()
    unanswered = [b"1"]
    ahead = ReadAhead(lambda: [b"1", b"5"], unanswered)
    Scope(conn, ahead=ahead).write(stmt("finish", 1), Role.LAST)  # type: ignore[arg-type]
    assert conn.log == [(SINGLE["finish"], (1, "a", None))]
    assert unanswered == [b"1", b"1", b"5"]
    loaded = ahead.take(conn)  # type: ignore[arg-type]
    assert conn.log[-1] == (GET_MESSAGES, ([1, 5],))
    assert [item.message_id for item in loaded] == [1, 5]


def test_read_ahead_only_for_a_statement_run_alone() -> None:
    """Inside the message's transaction (its handler used msg.db, or a step),
    nothing is read ahead; nor when no line is waiting."""
    conn = RowsConn()
    ahead = ReadAhead(lambda: [b"5"], [])
    scope = Scope(conn, ahead=ahead)  # type: ignore[arg-type]
    scope.write(stmt("set_state", 1), Role.STEP)
    scope.write(stmt("finish", 1), Role.LAST)
    scope.commit()
    assert all(e[0] != "with_rows" for e in conn.log) and ahead.take(conn) == []  # type: ignore
    idle = RowsConn()
    Scope(idle, ahead=ReadAhead(list, [])).write(stmt("finish", 2), Role.LAST)  # type: ignore[arg-type]
    assert idle.log == [(SINGLE["finish"], (2, "a", None))]


def test_read_ahead_failure_resends_the_transition_alone_then_loads_later() -> None:
    """The combined statement failed (as a whole: nothing committed): the
    transition goes again alone, so only its own error could fail the message;
    the lines read ahead are loaded when their turn comes."""
    conn = RowsConn(fail_ahead=True)
    unanswered: list[bytes] = []
    ahead = ReadAhead(lambda: [b"5"], unanswered)
    Scope(conn, ahead=ahead).write(stmt("finish", 1), Role.LAST)  # type: ignore[arg-type]
    finish = (SINGLE["finish"], (1, "a", None))
    assert conn.log == [("with_rows", *finish[:1], (1, "a", None, [5])), finish]
    assert unanswered == [b"5"]
    (item,) = ahead.take(conn)  # type: ignore[arg-type]
    assert item.message_id == 5 and item.row is not None
    assert conn.log[-1] == (GET_MESSAGES, ([5],))


def test_read_ahead_keeps_row_lost_and_raises_a_lost_connection() -> None:
    conn = RowsConn(result=False)
    ahead = ReadAhead(lambda: [b"5"], [])
    with pytest.raises(RowLost, match="lost 1"):
        Scope(conn, ahead=ahead).write(stmt("finish", 1), Role.LAST)  # type: ignore[arg-type]
    assert ahead.take(conn)[0].row is not None  # type: ignore[arg-type]
    broken = RowsConn(fail_ahead=True)
    broken.broken = True
    with pytest.raises(psycopg.Error):
        Scope(broken, ahead=ReadAhead(lambda: [b"5"], [])).write(  # type: ignore[arg-type]
            stmt("finish", 1), Role.LAST
        )


def test_line_reader_ready_never_blocks_and_keeps_a_partial_line() -> None:
    r, w = os.pipe()
    reader = LineReader(r, lambda: None, lambda: None)
    assert reader.ready() == []  # nothing written: returns at once
    os.write(w, b"1\n2\n3")
    assert reader.ready() == [b"1", b"2"]
    os.write(w, b"\n")
    assert reader.ready() == [b"3"]
    os.close(w)
    os.close(r)


@pytest.mark.parametrize("mode", [CommitMode.PER_MESSAGE, CommitMode.GROUP])
def test_runner_serves_lines_read_ahead_in_turn_without_group_commit(mode: CommitMode) -> None:
    """One commit per message: id 2 arrives while 1 is processed, rides on 1's
    transition, is answered after it. Group commit leaves it for its next batch."""
    r, w = os.pipe()
    answers_r, answers_w = os.pipe()
    conn = RowsConn()
    dispatch = HandlerDispatch({"a": lambda msg: Finish()}, "a", GRAPH, Statements(None))
    runner = StageRunner(dispatch, ConnectionHolder(conn), mode, answers_w, r)  # type: ignore[arg-type]
    os.write(w, b"1\n")
    lines = runner.reader.lines()
    os.write(w, b"2\n")
    runner._batch_single(lines, Attempt.FIRST)
    finish = SINGLE["finish"]
    if mode is CommitMode.PER_MESSAGE:
        assert conn.log == [
            (GET_MESSAGES, ([1],)),
            ("with_rows", finish, (1, "a", None, [2])),
            (finish, (2, "a", None)),
        ]
        assert os.read(answers_r, 100) == b"0\n0\n" and lines == []
    else:
        assert conn.log == [(GET_MESSAGES, ([1],)), (finish, (1, "a", None))]
        assert os.read(answers_r, 100) == b"0\n" and runner.reader.lines() == [b"2"]
    for fd in (r, w, answers_r, answers_w):
        os.close(fd)


def test_set_based_kinds_name_a_function_each() -> None:
    from pepsi_dispatch.sdk.statements import SET_BASED_FUNCTIONS
    from pepsi_dispatch.sdk.transaction import SET_BASED

    assert set(SET_BASED) == set(SET_BASED_FUNCTIONS)


def test_group_batch_without_the_set_based_functions_goes_row_by_row() -> None:
    conn = FakeConn()
    batch = GroupBatch(conn, frozenset())  # a database older than finish_many
    for slot, message_id in enumerate((1, 2)):
        batch.slot = slot
        batch.defer(stmt("finish", message_id))
    batch.flush()
    assert conn.log[1] == (MANY["finish"], ([1, 2], ["a", "a"], [None, None]))
    assert batch.lost == {}


def test_a_second_copy_of_an_id_is_never_given_the_row_read_for_the_first() -> None:
    from pepsi_dispatch.sdk.loading import RELOAD, loaded_lines

    row = (5, "a", "running", {}, {}, 0)
    loaded = loaded_lines([b"5\n", b"x\n", b"6\n", b"5\n"], {5: row})
    assert [item.row for item in loaded] == [row, None, None, RELOAD]


def test_distinct_runs_cut_before_each_second_copy() -> None:
    from pepsi_dispatch.sdk.loading import distinct_runs

    lines = [b"1\n", b"2\n", b"x\n", b"1\n", b"3\n", b"3\n", b"x\n"]
    assert distinct_runs(lines) == [[b"1\n", b"2\n", b"x\n"], [b"1\n", b"3\n"], [b"3\n", b"x\n"]]
    assert distinct_runs([]) == []
