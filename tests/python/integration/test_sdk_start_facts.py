"""What a starting SDK worker asks the database: one statement on a database
migrated to head, the same answers as the questions asked one at a time, and
those questions one at a time where the one statement cannot run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pepsi_dispatch.sdk.facts import (
    may_call,
    overlay_rows,
    retry_stages,
    set_based_kinds,
    start_facts,
)
from pepsi_dispatch.sdk.statements import NOTE_TRACEBACK


def _seed(conn: psycopg.Connection) -> None:
    conn.execute(
        "INSERT INTO pepsi.config (section, option, value) VALUES"
        " ('stage-b', 'NEXT', 'c'), ('stage-a', 'NEXT', 'b'), ('stage-c', 'PARALLELISM', '2')"
    )
    conn.execute(
        "INSERT INTO pepsi.stages (stage, next, retry_delay) VALUES"
        " ('a', '{b}', '5 s'), ('b', '{c}', NULL), ('c', '{}', '1 min')"
    )


def _counting(conn: psycopg.Connection) -> list[str]:
    """The statements ``conn.execute`` runs from now on."""
    sent: list[str] = []
    execute: Callable[..., Any] = conn.execute

    def counted(query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return execute(query, *args, **kwargs)

    conn.execute = counted  # type: ignore[method-assign]
    return sent


def test_one_statement_answers_what_the_single_questions_answer(conn):
    _seed(conn)
    sent = _counting(conn)
    facts = start_facts(conn)
    assert len(sent) == 1
    assert facts.overlay == overlay_rows(conn)
    assert facts.overlay == [
        ("stage-a", "NEXT", "b"),
        ("stage-b", "NEXT", "c"),
        ("stage-c", "PARALLELISM", "2"),
    ]
    assert facts.retry_stages == retry_stages(conn) == frozenset({"a", "c"})
    assert facts.keeps_tracebacks is may_call(conn, NOTE_TRACEBACK) is True
    assert facts.set_based == set_based_kinds(conn) == frozenset({"finish", "advance"})


def test_an_empty_overlay_and_registry_are_empty_answers(conn):
    facts = start_facts(conn)
    assert facts.overlay == [] and facts.retry_stages == frozenset()


def test_the_stage_role_gets_the_same_answers(conn):
    _seed(conn)
    conn.execute("SET ROLE pepsi_stage")
    sent = _counting(conn)
    facts = start_facts(conn)
    assert len(sent) == 1
    assert facts.retry_stages == frozenset({"a", "c"})
    assert facts.keeps_tracebacks and facts.set_based == frozenset({"finish", "advance"})


def test_a_database_without_the_registry_is_asked_one_question_at_a_time(conn):
    """Before the stage registry (or where the role may not read it) the one
    statement fails: each question is asked alone, the registry's answer empty."""
    _seed(conn)
    conn.execute("DROP FUNCTION pepsi.registered_stages()")
    conn.execute("DROP FUNCTION pepsi.advance_many(bigint[], text, text, bigint)")
    sent = _counting(conn)
    facts = start_facts(conn)
    assert len(sent) > 1
    assert facts.overlay == overlay_rows(conn) and len(facts.overlay) == 3
    assert facts.retry_stages == frozenset()
    assert facts.set_based == frozenset({"finish"})


def test_a_database_without_the_overlay_function_raises_undefined_function(conn):
    conn.execute("DROP FUNCTION pepsi.stage_config()")
    with pytest.raises(psycopg.errors.UndefinedFunction):
        start_facts(conn)


def test_a_role_that_may_not_call_note_traceback_is_told_so(conn):
    conn.execute(f"REVOKE EXECUTE ON FUNCTION {NOTE_TRACEBACK} FROM pepsi_stage, PUBLIC")
    conn.execute("SET ROLE pepsi_stage")
    facts = start_facts(conn)
    assert facts.keeps_tracebacks is False
