"""pepsi.advance_many: pepsi.advance for a batch of ids, in one statement (migration 0015).

Its behaviour in detail is tests/sql/advance_many.sql; here: what advance would
do, who may call it, and the plan of its UPDATE (and finish_many's): rows found
by primary key whatever the statistics say, as the per-row transitions are
(test_sql_claim_plan.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from test_sql_claim_plan import captured_plans
from test_sql_finish_many import claimed


def _nodes(plan: dict) -> Iterator[dict]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _rows(conn: psycopg.Connection, ids: list[int]) -> list[tuple]:
    return [
        conn.execute(
            "SELECT stage, status, retries, dispatcher_id FROM pepsi.messages"
            " WHERE workqueue_id = %s",
            (i,),
        ).fetchone()
        for i in ids
    ]


def test_advance_many_advances_what_advance_would(conn: psycopg.Connection) -> None:
    did = conn.execute("SELECT pepsi.register_dispatcher('test', 1, false)").fetchone()[0]  # type: ignore[index]
    ids = claimed(conn, did, "a", 4)
    other = claimed(conn, did, "b", 1)
    pending = conn.execute("SELECT pepsi.enqueue('a', '{}')").fetchone()[0]  # type: ignore[index]
    call = "SELECT * FROM pepsi.advance_many(%s, 'a', 'c', %s)"
    # a wrong holder changes nothing
    assert conn.execute(call, (ids, did + 1)).fetchall() == []
    # only rows running at from_stage (and held by did) move on; the rest are left alone
    moved = conn.execute(call, (ids[:3] + other + [pending, 999_999_999], did)).fetchall()
    assert sorted(r[0] for r in moved) == sorted(ids[:3])
    assert _rows(conn, ids) == [("c", "pending", 0, None)] * 3 + [("a", "running", 0, did)]
    assert _rows(conn, other + [pending]) == [("b", "running", 0, did), ("a", "pending", 0, None)]
    # advanced rows are not advanced twice; without a dispatcher id any holder goes
    moved = conn.execute("SELECT * FROM pepsi.advance_many(%s, 'a', 'c')", (ids,)).fetchall()
    assert [r[0] for r in moved] == [ids[3]]


@pytest.mark.parametrize("to_stage", [None, "no such stage!"])
def test_advance_many_checks_to_stage_even_for_no_ids(
    conn: psycopg.Connection, to_stage: str | None
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="invalid stage name"):
        conn.execute("SELECT * FROM pepsi.advance_many('{}', 'a', %s)", (to_stage,))


ROLES = ("pepsi_stage", "pepsi_dispatcher", "pepsi_ingress", "pepsi_dashboard", "public")


def test_advance_many_is_for_stages_only(conn: psycopg.Connection) -> None:
    may = [
        conn.execute(
            "SELECT has_function_privilege(%s, 'pepsi.advance_many(bigint[], text, text, bigint)',"
            " 'EXECUTE')",
            (role,),
        ).fetchone()[0]  # type: ignore[index]
        for role in ROLES
    ]
    assert may == [True, False, False, False, False]


def test_the_many_transitions_find_rows_by_primary_key(conn: psycopg.Connection) -> None:
    """Statistics taken while nothing ran: the UPDATEs of advance_many and
    finish_many must still find their rows through workqueue_pkey (an index scan,
    which also visits, and locks, the ids in ascending order), never by walking
    workqueue_running_idx or the table."""
    conn.execute("INSERT INTO pepsi.workqueue (stage) SELECT 's0' FROM generate_series(1, 20000)")
    conn.execute("ANALYZE pepsi.workqueue")  # nothing running yet
    ids = [r[0] for r in conn.execute("SELECT * FROM pepsi.claim(1, %s, %s)", (["s0"], [3000]))]
    plans = captured_plans(
        conn,
        [
            ("SELECT * FROM pepsi.advance_many(%s, 's0', 's1', 1)", (ids[:256],)),
            ("SELECT * FROM pepsi.finish_many(%s, 's0', 1)", (ids[256:512],)),
        ],
    )
    updates = [p for p in plans if any(n["Node Type"] == "ModifyTable" for n in _nodes(p["Plan"]))]
    assert len(updates) == 2, [p.get("Query Text") for p in plans]
    for plan in updates:
        moved = next(n for n in _nodes(plan["Plan"]) if n["Node Type"] == "ModifyTable")
        assert moved["Actual Rows"] == 256
        found = [
            (n["Node Type"], n.get("Index Name"))
            for n in _nodes(plan["Plan"])
            if "Scan" in n["Node Type"]
        ]
        assert found == [("Index Scan", "workqueue_pkey")], found
