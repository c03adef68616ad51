"""Unit tests of the SDK (no database): read-ahead and batch loading."""

from __future__ import annotations

import psycopg
import pytest
from sdk_fakes import RowsConn, stmt

from pepsi_dispatch.sdk.ahead import ReadAhead
from pepsi_dispatch.sdk.loading import GET_MESSAGES
from pepsi_dispatch.sdk.statements import (
    SINGLE,
)
from pepsi_dispatch.sdk.transaction import (
    Role,
    RowLost,
    Scope,
)


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


def test_split_runs_carry_the_ids_of_their_lines() -> None:
    from pepsi_dispatch.sdk.loading import parse_ids, split_runs

    lines = [b"1\n", b"2\n", b"x\n", b"1\n", b"3\n", b"3\n", b"x\n"]
    runs = split_runs(lines, parse_ids(lines))
    assert runs == [
        ([b"1\n", b"2\n", b"x\n"], [1, 2, None]),
        ([b"1\n", b"3\n"], [1, 3]),
        ([b"3\n", b"x\n"], [3, None]),
    ]
    assert split_runs([], []) == []
