"""pepsi-queue, the operator CLI: enqueue, status, failed, requeue, purge."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from pepsi_dispatch.cli.queue import main


@pytest.fixture
def q(dsn, monkeypatch, capsys):
    """Run pepsi-queue in-process against the test database; returns (rc, stdout, stderr)."""
    monkeypatch.setenv("PEPSI_DSN", dsn)
    monkeypatch.delenv("PEPSI_CONFIG", raising=False)

    def run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        rc = main(list(args))
        out, err = capsys.readouterr()
        return rc, out, err

    return run


def fail_rows(conn: psycopg.Connection, stage: str, n: int, reason: str = "broken") -> list[int]:
    """n messages at `stage`, claimed and failed by the stage with `reason`."""
    did = conn.execute("SELECT pepsi.register_dispatcher('t', 1, false)").fetchone()[0]
    ids = [conn.execute("SELECT pepsi.enqueue(%s)", (stage,)).fetchone()[0] for _ in range(n)]
    conn.execute("SELECT * FROM pepsi.claim(%s, %s, %s)", (did, [stage], [n]))
    for i in ids:
        assert conn.execute("SELECT pepsi.fail(%s, %s, %s)", (i, stage, reason)).fetchone()[0]
    return ids


def test_enqueue_arguments_stdin_and_empty(q, conn):
    rc, out, _ = q("enqueue", "fetch", '{"url": "a"}', '{"list": [1, 2]}')
    assert rc == 0
    ids = [int(x) for x in out.split()]
    assert len(ids) == 2
    rc, out, _ = q("enqueue", "fetch", "-", stdin='{"n": 1}\n\n{"n": 2}\n')
    assert rc == 0 and len(out.split()) == 2
    rc, out, _ = q("enqueue", "-q", "other")
    assert rc == 0 and out.strip() == "enqueued 1 message(s) at stage other"
    payloads = conn.execute("SELECT payload FROM pepsi.messages ORDER BY workqueue_id").fetchall()
    assert [p for (p,) in payloads] == [{"url": "a"}, {"list": [1, 2]}, {"n": 1}, {"n": 2}, {}]
    # Payloads are JSON objects (migration 0009): [1, 2] used to be accepted here.
    rc, out, err = q("enqueue", "fetch", "[1, 2]")
    assert rc == 2 and out == "" and "argument 1 must be a JSON object" in err


def test_enqueue_errors(q):
    rc, _, err = q("enqueue", "fetch", "{bad")
    assert rc == 2 and "argument 1 is not JSON" in err
    rc, _, err = q("enqueue", "bad name", "{}")
    assert rc == 1 and "invalid stage name" in err
    assert err.count("\n") == 1  # one line, no traceback


def test_status_table_and_json(q, conn):
    rc, out, _ = q("status")
    assert rc == 0 and "empty" in out
    q("enqueue", "a", "{}", "{}")
    fail_rows(conn, "b", 1)
    # fail_rows' dispatcher is gone.
    conn.execute("DELETE FROM pepsi.dispatchers")
    rc, out, _ = q("status")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["stage", *STATUS_HEADER, "total", "health"]
    # No dispatcher has reported the stages: their health is unknown, and it says so.
    assert lines[1].split() == ["a", "2", "0", "0", "0", "0", "0", "0", "2", "unknown"]
    assert lines[2].split() == ["b", "0", "0", "0", "0", "1", "0", "0", "1", "unknown"]
    assert lines[3].split()[0] == "TOTAL" and lines[3].split()[-1] == "3"
    assert lines[4].startswith("NO LIVE DISPATCHER: nothing is being dispatched")
    rc, out, _ = q("status", "--json")
    zeros = dict.fromkeys(STATUS_HEADER, 0)
    unknown = {"health": {"state": "unknown"}}
    # Every status, zeros included (series that vanish at zero break scripts and alerts).
    assert json.loads(out) == {
        "a": {**zeros, "pending": 2, **unknown},
        "b": {**zeros, "failed": 1, **unknown},
    }


STATUS_HEADER = ["pending", "running", "paused", "done", "failed", "timeout", "expired"]


def test_status_says_plainly_when_no_dispatcher_is_live(q, conn, dsn):
    """Liveness by session, as /healthz: a dispatcher killed with SIGKILL leaves a fresh
    heartbeat behind and counted as live for minutes; status now says none is."""
    q("enqueue", "a", "{}")
    with psycopg.connect(dsn, autocommit=True) as gone:  # registers, then its session ends
        gone.execute("SELECT pepsi.register_dispatcher('killed', 1, false)")
    deadline = time.monotonic() + 30
    while True:  # the closed session's backend exits on its own time
        rc, out, _ = q("status")
        if "NO LIVE DISPATCHER" in out or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert rc == 0 and out.splitlines()[-1].startswith("NO LIVE DISPATCHER: nothing is being"), out
    conn.execute("SELECT pepsi.register_dispatcher('here', 2, false)")  # this session stays
    rc, out, _ = q("status")
    assert out.splitlines()[-1] == "dispatchers: 1 live of 2 registered", out


def test_failed_lists_errors(q, conn):
    rc, out, _ = q("failed")
    assert rc == 0 and "no failed messages" in out
    ids = fail_rows(conn, "extract", 2, "malformed document")
    fail_rows(conn, "store", 1, "disk full")
    rc, out, _ = q("failed", "--stage", "extract", "--payload")
    assert rc == 0
    assert f"{ids[1]} extract failed" in out and "malformed document" in out
    assert "disk full" not in out and "payload {}" in out
    rc, out, _ = q("failed", "--limit", "1")
    assert len(out.splitlines()) == 1 and "disk full" in out  # newest first


def test_requeue_by_stage_id_all(q, conn):
    a = fail_rows(conn, "a", 2)
    b = fail_rows(conn, "b", 2)
    rc, _, err = q("requeue")
    assert rc == 2 and "--stage" in err
    rc, out, _ = q("requeue", "--stage", "a", "--yes")
    assert rc == 0 and out.strip() == "requeued 2 message(s)"
    rc, out, _ = q("requeue", "--id", str(b[0]))
    assert out.strip() == f"requeued 1 message(s): {b[0]}"
    rc, out, _ = q("requeue", "--all", "--yes")
    assert out.strip() == "requeued 1 message(s)"
    rows = conn.execute(
        "SELECT status, state->'previous_error'->>'error' FROM pepsi.messages"
        " WHERE workqueue_id = ANY(%s)",
        (a + b,),
    ).fetchall()
    assert rows == [("pending", "broken")] * 4


def test_purge_terminal_only(q, conn):
    fail_rows(conn, "a", 2)
    q("enqueue", "a", "{}")
    rc, out, _ = q("purge", "--older-than", "1 h")
    assert rc == 0 and out.strip() == "purged 0 message(s)"
    rc, out, _ = q("purge", "--status", "done")
    assert out.strip() == "purged 0 message(s)"
    rc, out, _ = q("purge", "--stage", "a")
    assert out.strip() == "purged 2 message(s)"
    left = conn.execute("SELECT status FROM pepsi.messages").fetchall()
    assert left == [("pending",)]  # pending rows are never purged
    rc, _, err = q("purge", "--older-than", "soon")
    assert rc == 2 and "--older-than" in err


def test_console_script_and_bad_database(dsn, tmp_path: Path):
    exe = Path(sys.executable).parent / "pepsi-queue"
    if not exe.exists():
        pytest.skip("pepsi-queue console script not installed")
    env = {"PEPSI_DSN": dsn, "PATH": "/usr/bin:/bin"}
    ok = subprocess.run([str(exe), "status"], env=env, capture_output=True, text=True)
    assert ok.returncode == 0
    bad = subprocess.run(
        [str(exe), "status"],
        env={**env, "PEPSI_DSN": f"host={tmp_path} dbname=nothing"},
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1
    assert bad.stderr.startswith("pepsi-queue: error: cannot reach the database")
    assert "Traceback" not in bad.stderr


def test_unmigrated_database_gets_the_migrate_hint(empty_dsn, monkeypatch, capsys):
    monkeypatch.setenv("PEPSI_DSN", empty_dsn)
    monkeypatch.delenv("PEPSI_CONFIG", raising=False)
    rc = main(["status"])
    err = capsys.readouterr().err
    assert rc == 1 and "pepsi-queue migrate" in err, err
    assert err.count("\n") == 1
