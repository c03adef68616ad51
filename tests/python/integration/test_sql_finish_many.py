"""pepsi.finish_many: pepsi.finish for a batch of ids, in one statement (migration 0011)."""

from __future__ import annotations

import psycopg


def claimed(conn: psycopg.Connection, did: int, stage: str, n: int) -> list[int]:
    """Enqueue n rows at stage and claim them all for did: their ids."""
    ids = [
        conn.execute("SELECT pepsi.enqueue(%s, '{}')", (stage,)).fetchone()[0]  # type: ignore[index]
        for _ in range(n)
    ]
    got = conn.execute(
        "SELECT workqueue_id FROM pepsi.claim(%s, %s, %s)", (did, [stage], [n])
    ).fetchall()
    assert sorted(r[0] for r in got) == sorted(ids)
    return ids


def _status(conn: psycopg.Connection, ids: list[int]) -> list[str]:
    return [
        conn.execute("SELECT status FROM pepsi.messages WHERE workqueue_id = %s", (i,)).fetchone()[
            0
        ]  # type: ignore[index]
        for i in ids
    ]


def test_finish_many_finishes_what_finish_would(conn: psycopg.Connection) -> None:
    did = conn.execute("SELECT pepsi.register_dispatcher('test', 1, false)").fetchone()[0]  # type: ignore[index]
    ids = claimed(conn, did, "a", 4)
    other = claimed(conn, did, "b", 1)
    pending = conn.execute("SELECT pepsi.enqueue('a', '{}')").fetchone()[0]  # type: ignore[index]
    # a wrong holder changes nothing
    assert conn.execute("SELECT pepsi.finish_many(%s, 'a', %s)", (ids, did + 1)).fetchall() == []
    # only rows running at from_stage (and held by did) are finished; the rest are left alone
    done = conn.execute(
        "SELECT * FROM pepsi.finish_many(%s, 'a', %s)",
        (ids[:3] + other + [pending, 999_999_999], did),
    ).fetchall()
    assert sorted(r[0] for r in done) == sorted(ids[:3])
    assert _status(conn, ids) == ["done", "done", "done", "running"]
    assert _status(conn, other + [pending]) == ["running", "pending"]
    row = conn.execute(
        "SELECT dispatcher_id, timeout FROM pepsi.messages WHERE workqueue_id = %s", (ids[0],)
    ).fetchone()
    assert row == (None, None)
    # finished rows are not finished twice; without a dispatcher id any holder goes
    done = conn.execute("SELECT * FROM pepsi.finish_many(%s, 'a')", (ids,)).fetchall()
    assert [r[0] for r in done] == [ids[3]]


def test_finish_many_is_for_stages_only(conn: psycopg.Connection) -> None:
    rows = conn.execute(
        "SELECT r.rolname FROM pg_proc p, aclexplode(p.proacl) a JOIN pg_roles r"
        " ON r.oid = a.grantee WHERE p.proname = 'finish_many' AND a.privilege_type = 'EXECUTE'"
    ).fetchall()
    assert "pepsi_stage" in [r[0] for r in rows]
    public = conn.execute(
        "SELECT has_function_privilege('public', 'pepsi.finish_many(bigint[], text, bigint)',"
        " 'EXECUTE')"
    ).fetchone()[0]  # type: ignore[index]
    assert public is False
