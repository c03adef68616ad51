"""The dispatcher refuses a database below its schema floor, saying what to run."""

from __future__ import annotations

from pathlib import Path

from dispatch_harness import Harness
from test_sql_migrations import alembic


def test_a_database_one_migration_behind_is_refused_with_the_fix(
    empty_dsn: str, tmp_path: Path
) -> None:
    alembic(empty_dsn, "upgrade", "head")
    alembic(empty_dsn, "downgrade", "-1")
    h = Harness(tmp_path, empty_dsn)
    try:
        d = h.start(h.conf(h.pipeline(["a"])), wait=False)
        assert d.wait_exit(60) == 2
        log = d.log()
        assert "needs 00" in log and "pepsi-queue migrate" in log, log[-2000:]
        assert h.conn.execute("SELECT count(*) FROM pepsi.dispatchers").fetchone() == (0,)
    finally:
        h.close()
