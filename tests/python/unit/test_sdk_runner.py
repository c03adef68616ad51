"""Unit tests of the SDK (no database): the runner's states."""

from __future__ import annotations

import os

import pytest
from sdk_fakes import GRAPH, RowsConn, make_runner

from pepsi_dispatch.sdk import runner as runner_mod
from pepsi_dispatch.sdk.connection import ConnectionHolder
from pepsi_dispatch.sdk.loading import GET_MESSAGES
from pepsi_dispatch.sdk.message import Finish
from pepsi_dispatch.sdk.routing import Attempt, HandlerDispatch
from pepsi_dispatch.sdk.runner import RunnerState, StageRunner
from pepsi_dispatch.sdk.statements import (
    SINGLE,
    Statements,
)
from pepsi_dispatch.sdk.transaction import (
    CommitMode,
)


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


def test_group_commit_parses_each_id_line_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ids parsed when a batch is cut into runs serve its loading too."""
    from pepsi_dispatch.sdk import loading

    parsed: list[bytes] = []
    parse_id = loading.parse_id

    def counting(line: bytes) -> int | None:
        parsed.append(line)
        return parse_id(line)

    monkeypatch.setattr(loading, "parse_id", counting)
    r, w = os.pipe()
    answers_r, answers_w = os.pipe()
    conn = RowsConn()
    dispatch = HandlerDispatch({"a": lambda msg: Finish()}, "a", GRAPH, Statements(None))
    runner = StageRunner(dispatch, ConnectionHolder(conn), CommitMode.GROUP, answers_w, r)  # type: ignore[arg-type]
    os.write(w, b"1\n2\nx\n3\n")
    os.close(w)
    assert runner.serve() == 0
    assert os.read(answers_r, 100) == b"0\n0\n1 not a message id: x\n0\n"
    assert sorted(parsed) == [b"1", b"2", b"3", b"x"]
    for fd in (r, answers_r, answers_w):
        os.close(fd)
