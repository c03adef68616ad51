"""Unit tests of the SDK (no database): handler dispatch against a recording scope,
the graph checks and the state patch."""

from __future__ import annotations

import pytest
from sdk_fakes import GRAPH, RecordingScope, dispatch, row

from pepsi_dispatch.sdk.loading import Loaded
from pepsi_dispatch.sdk.message import Advance, Fail, Finish, Message, Refused
from pepsi_dispatch.sdk.routing import Attempt, StageGraph, state_patch
from pepsi_dispatch.sdk.statements import (
    Statement,
)
from pepsi_dispatch.sdk.transaction import (
    Role,
    RowLost,
)


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


def test_a_redo_that_finds_its_row_pending_at_its_stage_lost_its_claim() -> None:
    """After a failover the claim may not have reached the standby: the row is
    pending at our stage again. Not "0" (a success counted that did not happen,
    and the message runs again elsewhere); not run here; nothing written."""
    d = dispatch({})
    scope = RecordingScope()
    again = Loaded(b"7", 7, row("a", "pending"))
    answer = d.process(again, scope, Attempt.REDO)
    assert answer.startswith("1 message 7 is pending at stage a again: its claim was lost")
    assert d.process(again, scope) == (
        "1 message 7 is not running at stage a (it is pending at stage a)"
    )
    # Pending at the next stage: our advance went through.
    assert d.process(Loaded(b"7", 7, row("b", "pending")), scope, Attempt.REDO) == "0"
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


def test_message_db_outside_processing_raises() -> None:
    msg = Message(id=1, stage="a", payload={}, state={}, retries=0)
    with pytest.raises(RuntimeError, match="not being processed"):
        _ = msg.db
