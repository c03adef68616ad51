"""pepsi-queue status --watch counts dispatchers live by the database's rule.

queue_dispatchers (v3, migration 0017) says whether each dispatcher is live by
its session: the liveness lock its registration and heartbeats take, which a
dispatcher killed with SIGKILL loses with its connections, whatever its
heartbeat's age. tests/sql/dispatcher_liveness.sql covers the SQL; this is the
command's end of it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

EXE = Path(sys.executable).parent / "pepsi-queue"


def dispatcher(conn: psycopg.Connection, interval: float | None, age_s: int) -> int:
    did = conn.execute("SELECT pepsi.register_dispatcher('h', 1, true)").fetchone()[0]
    gauges = {} if interval is None else {"heartbeat_interval": interval}
    conn.execute("SELECT pepsi.heartbeat(%s, %s::jsonb)", (did, json.dumps(gauges)))
    conn.execute(  # an old heartbeat (the test sets the clock back; no API does)
        "UPDATE pepsi.dispatchers SET heartbeat_at = now() - make_interval(secs => %s)"
        " WHERE dispatcher_id = %s",
        (age_s, did),
    )
    return did


def test_watch_counts_live_dispatchers_by_their_session(
    dsn: str, conn: psycopg.Connection, tmp_path: Path
) -> None:
    if not EXE.exists():
        pytest.skip("pepsi-queue console script not installed")
    slow = dispatcher(conn, 100.0, 200)  # its session is there: live, old heartbeat or not
    plain = dispatcher(conn, None, 400)  # no interval, 400 s: still live by its session
    with psycopg.connect(dsn, autocommit=True) as other:
        killed = dispatcher(other, 1.0, 0)  # fresh heartbeat, but its session ends here
    deadline = time.monotonic() + 30  # the closed session's backend exits on its own time
    while True:
        live = dict(conn.execute("SELECT dispatcher_id, live FROM pepsi.queue_dispatchers()"))
        if not live[killed] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert live == {slow: True, killed: False, plain: True}
    env = {"PEPSI_DSN": dsn, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    r = subprocess.run(
        [str(EXE), "status", "--watch", "--count", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "dispatchers: 2 live of 3 registered" in r.stdout, r.stdout
    lines = {int(ln.split(":")[0]): ln for ln in r.stdout.splitlines() if ln.startswith("  ")}
    assert "(not live)" in lines[killed] and "(not live)" not in lines[slow] + lines[plain]
