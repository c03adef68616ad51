"""pepsi-queue cancel/requeue --id, as a real process: the ids it acted on are
reported as done (stdout), and only the others as errors, each with why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

EXE = Path(sys.executable).parent / "pepsi-queue"


@pytest.fixture
def pq(dsn: str, tmp_path: Path):
    """Run the pepsi-queue console script against ``dsn``; returns the CompletedProcess."""
    env = {"PEPSI_DSN": dsn, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(EXE), *args], env=env, capture_output=True, text=True, timeout=60
        )

    return run


def row(conn: psycopg.Connection, stage: str, status: str, dedupe_key: str | None = None) -> int:
    return conn.execute(
        "INSERT INTO pepsi.workqueue (stage, status, dedupe_key, timeout, dispatcher_id, state)"
        """ VALUES (%s, %s, %s, %s, %s, '{"error": "boom"}') RETURNING workqueue_id""",
        (
            stage,
            status,
            dedupe_key,
            "infinity" if status == "paused" else None,
            1 if status == "running" else None,
        ),
    ).fetchone()[0]


def status_of(conn: psycopg.Connection, mid: int) -> str:
    return conn.execute(
        "SELECT status FROM pepsi.messages WHERE workqueue_id = %s", (mid,)
    ).fetchone()[0]


def errors(r: subprocess.CompletedProcess[str]) -> list[str]:
    return [line.removeprefix("pepsi-queue: error: ") for line in r.stderr.splitlines()]


def id_args(*ids: int) -> list[str]:
    return [a for mid in ids for a in ("--id", str(mid))]


def test_cancel_reports_acted_on_ids_as_done_and_only_the_others_as_errors(pq, conn) -> None:
    conn.execute(
        "SELECT pepsi.register_stages(1, ARRAY['a', 'b'], NULL, NULL, NULL, NULL, NULL, NULL)"
    )
    pending, paused = row(conn, "a", "pending"), row(conn, "a", "paused")
    running, done, other = (
        row(conn, "a", "running"),
        row(conn, "a", "done"),
        row(conn, "b", "pending"),
    )
    r = pq("cancel", *id_args(pending, paused, running, done, 99999))
    assert r.returncode == 1
    assert r.stdout == f"cancelled 2 message(s): {pending}, {paused}\n"
    assert errors(r) == [
        f"cancel: message {running} is running, not pending or paused",
        f"cancel: message {done} is done, not pending or paused",
        "cancel: no message 99999",
    ]
    assert [status_of(conn, m) for m in (pending, paused, running)] == [
        "failed",
        "failed",
        "running",
    ]
    r = pq("cancel", "--stage", "a", *id_args(other))
    assert r.returncode == 1 and r.stdout == "cancelled 0 message(s)\n"
    assert errors(r) == [f"cancel: message {other} is at stage b, not a"]
    r = pq("cancel", *id_args(other, other))
    assert (r.returncode, r.stdout, r.stderr) == (0, f"cancelled 1 message(s): {other}\n", "")


def test_requeue_reports_acted_on_ids_as_done_and_only_the_others_as_errors(pq, conn) -> None:
    conn.execute("SELECT pepsi.register_stages(1, ARRAY['a'], NULL, NULL, NULL, NULL, NULL, NULL)")
    failed, timed_out, pending = (
        row(conn, "a", "failed"),
        row(conn, "a", "timeout"),
        row(conn, "a", "pending"),
    )
    live, held = row(conn, "a", "paused", "k1"), row(conn, "a", "failed", "k1")
    first, second = row(conn, "a", "failed", "k2"), row(conn, "a", "failed", "k2")
    r = pq("requeue", *id_args(failed, timed_out, pending, held, first, second, 99999))
    assert r.returncode == 1
    assert r.stdout == f"requeued 3 message(s): {failed}, {timed_out}, {first}\n"
    assert errors(r) == [
        f"requeue: message {pending} is pending, not failed, timeout or expired",
        f"requeue: message {held} keeps its failed status: its dedupe key 'k1' is carried by"
        " a pending, running or paused message",
        f"requeue: message {second} keeps its failed status: its dedupe key 'k2' is carried by"
        " a pending, running or paused message",
        "requeue: no message 99999",
    ]
    assert status_of(conn, live) == "paused" and status_of(conn, held) == "failed"
