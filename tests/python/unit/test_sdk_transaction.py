"""Unit tests of the SDK (no database): how a statement is sent (call_mode), group
commit's bookkeeping (plan_flush, GroupBatch, the set-based calls) and a message's
transaction levels (Scope)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from sdk_fakes import FakeConn, FakeCursor, advance, stmt

from pepsi_dispatch.sdk.statements import (
    ADVANCE_MANY,
    FINISH_MANY,
    MANY,
    SINGLE,
    Statement,
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


def test_group_batch_of_one_statement_sends_it_alone() -> None:
    """Handlers that all finish become one set-based statement: in autocommit it
    is a transaction of its own, sent without BEGIN, COMMIT or a pipeline."""
    conn = FakeConn()
    batch = GroupBatch(conn)
    for slot, message_id in enumerate((1, 2)):
        batch.slot = slot
        Scope(conn, CommitMode.GROUP, batch).write(stmt("finish", message_id), Role.LAST)
    assert conn.log == []
    batch.commit()
    assert conn.log == [(FINISH_MANY, ([1, 2], "a", None))]
    assert batch.lost == {}


def test_group_batch_of_one_statement_that_changed_nothing_notes_the_lost_row() -> None:
    conn = FakeConn(result=False)
    batch = GroupBatch(conn)
    batch.defer(stmt("finish", 7))
    batch.commit()
    assert batch.lost == {0: "lost 7"}


def test_group_batch_without_savepoints_commits_in_one_pipeline() -> None:
    """Several statements (a state patch and the transitions) go in one pipeline
    between BEGIN and COMMIT: one round trip, all or nothing."""
    conn = FakeConn()
    batch = GroupBatch(conn)
    for slot, message_id in enumerate((1, 2)):
        batch.slot = slot
        scope = Scope(conn, CommitMode.GROUP, batch)
        if message_id == 1:
            scope.write(stmt("set_state", message_id), Role.STEP)
        scope.write(stmt("finish", message_id), Role.LAST)
    batch.commit()
    assert conn.log == [
        "pipeline",
        ("BEGIN", None),
        (SINGLE["finish"], (2, "a", None)),  # grouped by the place in the message
        (SINGLE["set_state"], (1, "a", None)),
        (SINGLE["finish"], (1, "a", None)),
        ("COMMIT", None),
        "sync",
    ]


def test_group_batch_reading_ahead_commits_in_one_pipeline() -> None:
    """The next batch's rows are read inside the transaction, before its COMMIT."""
    conn = FakeConn()
    batch = GroupBatch(conn)
    batch.defer(stmt("finish", 1))
    batch.read_ahead = [5, 6]
    batch.commit()
    assert conn.log[:3] == ["pipeline", ("BEGIN", None), (SINGLE["finish"], (1, "a", None))]
    assert conn.log[-2:] == [("COMMIT", None), "sync"]


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
    batch.defer(stmt("set_state", 1))
    batch.defer(stmt("finish", 1))
    with pytest.raises(BatchFailed, match="boom"):
        batch.commit()
    assert conn.log[-1] == ("ROLLBACK", None)  # the BEGIN of the pipeline is undone


def test_group_batch_whose_one_statement_fails_fails_the_batch() -> None:
    class Failing(FakeConn):
        def execute(self, sql: str, params: object = None) -> object:
            self.log.append((sql, params))
            raise psycopg.errors.DivisionByZero("boom")

    conn = Failing()
    batch = GroupBatch(conn)
    batch.defer(stmt("finish", 1))
    with pytest.raises(BatchFailed, match="boom"):
        batch.commit()
    assert conn.log == [(SINGLE["finish"], (1, "a", None))]  # nothing to roll back


def test_group_scope_needs_its_batch() -> None:
    with pytest.raises(ValueError):
        Scope(FakeConn(), CommitMode.GROUP)


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
