"""Unit tests of the SDK (no database): the statements a transition becomes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pepsi_dispatch.sdk.message import Advance, Fail, Finish, Pause, Refused
from pepsi_dispatch.sdk.statements import (
    Statement,
    Statements,
)


def said(statement: Statement) -> tuple[str, tuple[Any, ...], str]:
    """What a statement does and says when lost, however its error is given."""
    return (statement.kind, statement.params, statement.lost)


def test_statements_of_each_transition() -> None:
    s = Statements(9)
    assert said(s.transition(1, "a", Advance("b"))) == said(
        Statement("advance", (1, "a", "b", 9), s.lost(1, "a", "advance"))
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


def test_lost_text_is_formatted_on_demand_with_the_same_words() -> None:
    fenced = Statements(9).transition(7, "a", Advance("b"))
    assert fenced.lost == (
        "advance of message 7 changed nothing: it is no longer running at stage a under"
        " dispatcher 9 (the dispatcher may have timed it out or requeued it)"
    )
    unfenced = Statements(None).transition(7, "a", Pause(1))
    assert unfenced.lost == (
        "pause of message 7 changed nothing: it is no longer running at stage a"
        " (the dispatcher may have timed it out or requeued it)"
    )
    assert Statements(None).fail(7, "a", "why").lost.startswith("fail of message 7 ")
    assert Statement("finish", (7, "a", None), "given").lost == "given"
    assert said(fenced) != said(Statement("advance", fenced.params, "another text"))
