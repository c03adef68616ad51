"""pepsi-queue enqueue STAGE - with many JSON lines: progress, a count, all or nothing."""

from __future__ import annotations

import os
import subprocess

import psycopg
from dispatch_harness import VENV_BIN

QUEUE = VENV_BIN / "pepsi-queue"


def enqueue_stdin(dsn: str, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(QUEUE), "enqueue", "bulk", "-", "--force", "-q"],
        input=text,
        env={**os.environ, "PEPSI_DSN": dsn, "PEPSI_CONFIG": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )


def count(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM pepsi.workqueue WHERE stage = 'bulk'").fetchone()[0]


def test_a_large_enqueue_from_stdin_ends_with_its_count(dsn: str, conn: psycopg.Connection) -> None:
    n = 60_000
    out = enqueue_stdin(dsn, "".join(f'{{"n": {i}}}\n' for i in range(n)))
    assert out.returncode == 0, out.stderr
    assert f"enqueued {n:,} message(s) at stage bulk" in out.stderr
    assert out.stdout.strip() == f"enqueued {n} message(s) at stage bulk"
    assert count(conn) == n
    first, last = conn.execute(
        "SELECT min(payload->>'n'), max((payload->>'n')::int) FROM pepsi.workqueue"
    ).fetchone()
    assert last == n - 1


def test_a_bad_line_is_named_and_nothing_is_enqueued(dsn: str, conn: psycopg.Connection) -> None:
    lines = [f'{{"n": {i}}}\n' for i in range(30_000)]
    lines[23_456] = '{"n": oops}\n'
    out = enqueue_stdin(dsn, "".join(lines))
    assert out.returncode != 0
    assert "line 23457" in out.stderr, out.stderr
    assert count(conn) == 0, "all or nothing: no message of the input was enqueued"
