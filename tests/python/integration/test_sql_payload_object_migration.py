"""Migration 0041: producers' rows must carry an object payload, checked by the
insert trigger and not by a CHECK, so a database holding a message from
before 0009 whose payload is another JSON value upgrades, and that message
still moves; and a producer's own insert of such a payload is refused."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from test_sql_migrations import alembic


def test_old_payloads_upgrade_and_move_while_a_producers_are_checked(empty_dsn: str) -> None:
    alembic(empty_dsn, "upgrade", "0040")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO pepsi.workqueue (stage, payload) VALUES ('s', '[1, 2]')")
    alembic(empty_dsn, "upgrade", "0041")
    name = f"producer_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN IN ROLE pepsi_ingress")
        try:
            claimed = conn.execute("SELECT count(*) FROM pepsi.claim(1, ARRAY['s'], ARRAY[2])")
            assert claimed.fetchone()[0] == 1, "the old message can still be claimed"
            with psycopg.connect(make_conninfo(empty_dsn, user=name), autocommit=True) as prod:
                with pytest.raises(psycopg.errors.CheckViolation, match="JSON array"):
                    prod.execute("INSERT INTO pepsi.workqueue (stage, payload) VALUES ('s', '[3]')")
                prod.execute("INSERT INTO pepsi.workqueue (stage, payload) VALUES ('s', '{}')")
                with pytest.raises(psycopg.errors.CheckViolation):
                    with prod.cursor().copy(
                        "COPY pepsi.workqueue (stage, payload) FROM STDIN"
                    ) as cp:
                        cp.write('s\t{"a": 1}\ns\t"text"\n')
            kinds = conn.execute(
                "SELECT jsonb_typeof(payload), count(*) FROM pepsi.workqueue GROUP BY 1 ORDER BY 1"
            ).fetchall()
            assert kinds == [("array", 1), ("object", 1)], "the refused statements left nothing"
        finally:
            conn.execute(f"DROP OWNED BY {name}")
            conn.execute(f"DROP ROLE {name}")
    alembic(empty_dsn, "downgrade", "0040")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO pepsi.workqueue (stage, payload) VALUES ('s', '{}')")
