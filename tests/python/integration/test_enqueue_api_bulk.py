"""pepsi_dispatch.enqueue.enqueue_many and enqueue_lines through pepsi.enqueue_lines."""

from __future__ import annotations

import psycopg
import pytest

from pepsi_dispatch.enqueue import enqueue_lines, enqueue_many


def test_enqueue_many_keys_and_priority_land_in_order(conn: psycopg.Connection) -> None:
    held = conn.execute("SELECT pepsi.enqueue('s', '{}', dedupe_key => 'k-3')").fetchone()[0]
    docs = [{"n": i, "s": 'é\\\t\n"x'} for i in range(25)] + [None]
    keys = [f"k-{i}" if i % 2 else None for i in range(25)] + ["k-1"]
    ids = enqueue_many(conn, "s", docs, chunk_size=7, priority=-2, dedupe_keys=keys)
    assert len(ids) == 26
    assert ids[3] == held, "a key a live message holds: that message's id"
    assert ids[25] == ids[1], "a key an earlier element took (in another chunk): its id"
    new = [i for n, i in enumerate(ids) if n not in (3, 25)]
    assert new == sorted(new), "ids ascend in payload order"
    rows = conn.execute(
        "SELECT payload, priority, dedupe_key FROM pepsi.workqueue"
        " WHERE workqueue_id = ANY(%s) ORDER BY workqueue_id",
        (new,),
    ).fetchall()
    assert [r[0] for r in rows] == [d for n, d in enumerate(docs[:25]) if n != 3]
    assert {r[1] for r in rows} == {-2}
    assert [r[2] for r in rows] == [k for n, k in enumerate(keys[:25]) if n != 3]


def test_enqueue_many_refuses_a_non_object_before_asking(conn: psycopg.Connection) -> None:
    with pytest.raises(ValueError, match="payload 4 must be a JSON object"):
        enqueue_many(conn, "s", [{}, {}, {}, [1]], chunk_size=10)
    assert conn.execute("SELECT count(*) FROM pepsi.workqueue").fetchone()[0] == 0


def test_enqueue_lines_is_all_or_nothing_across_chunks(conn: psycopg.Connection) -> None:
    lines = [f'{{"n": {i}}}' for i in range(50)]
    lines[42] = '"just a string"'
    seen: list[int] = []
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="line 43 must be a JSON object"):
        enqueue_lines(conn, "s", lines, chunk_size=10, progress=seen.append)
    assert seen == [10, 20, 30, 40], "progress after each chunk that went in"
    assert conn.execute("SELECT count(*) FROM pepsi.workqueue").fetchone()[0] == 0
    lines[42] = ""
    ids = enqueue_lines(conn, "s", lines, chunk_size=10, key_field="n")
    assert len(ids) == 49
    assert (
        conn.execute("SELECT count(DISTINCT dedupe_key) FROM pepsi.workqueue").fetchone()[0] == 49
    )
