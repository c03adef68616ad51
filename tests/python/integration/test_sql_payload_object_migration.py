"""Migration 0041's CHECK on payloads: a database holding a message from before
0009 whose payload is not an object is not half-upgraded into a queue that
can no longer claim or requeue it; the upgrade stops and says what to do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
from test_sql_migrations import ROOT, alembic


def _upgrade(dsn: str) -> subprocess.CompletedProcess[str]:
    """``pepsi-queue migrate --to 0041``, as an operator runs it."""
    return subprocess.run(
        [str(Path(sys.executable).with_name("pepsi-queue")), "migrate", "--to", "0041"],
        cwd=ROOT,
        env={**os.environ, "PEPSI_DSN": dsn, "PEPSI_CONFIG": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_old_non_object_payload_stops_the_upgrade_with_the_fix(empty_dsn: str) -> None:
    alembic(empty_dsn, "upgrade", "0040")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO pepsi.workqueue (stage, payload) VALUES ('s', '[1, 2]')")
        conn.execute("INSERT INTO pepsi.workqueue (stage, payload) VALUES ('s', '{\"ok\": 1}')")
        refused = _upgrade(empty_dsn)
        assert refused.returncode != 0
        assert "1 message(s) in pepsi.workqueue and 0 in pepsi.dead_letters" in refused.stderr
        assert "jsonb_build_object('value', payload)" in refused.stderr, "the hint says how"
        assert refused.stderr.count("\n") <= 3, "one error line (after alembic's step)"
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == "0040"
        conn.execute(
            "UPDATE pepsi.workqueue SET payload = jsonb_build_object('value', payload)"
            " WHERE jsonb_typeof(payload) <> 'object'"
        )
    alembic(empty_dsn, "upgrade", "0041")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pepsi.workqueue").fetchone()[0] == 2
        claimed = conn.execute("SELECT count(*) FROM pepsi.claim(1, ARRAY['s'], ARRAY[2])")
        assert claimed.fetchone()[0] == 2, "both rows can still be claimed"
