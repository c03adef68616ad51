"""pepsi-queue status --watch counts dispatchers live by the database's rule.

queue_dispatchers v2 (migration 0014) says whether each dispatcher is live by
the rule of queue_overview v2 and dashboard_snapshot v2 (3 x the heartbeat
interval its gauges report, else 5 minutes, at least 10 s); the watch used a
fixed 120 s before. tests/sql/dispatcher_liveness.sql covers the SQL; this is
the command's end of it.
"""

from __future__ import annotations

import json
import subprocess
import sys
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


def test_watch_counts_live_dispatchers_by_their_heartbeat_interval(
    dsn: str, conn: psycopg.Connection, tmp_path: Path
) -> None:
    if not EXE.exists():
        pytest.skip("pepsi-queue console script not installed")
    slow = dispatcher(conn, 100.0, 200)  # 200 s < 3 x 100 s: live (120 s said not)
    fast = dispatcher(conn, 1.0, 60)  # 60 s > 10 s: gone (120 s said live)
    plain = dispatcher(conn, None, 200)  # no interval: 5 minutes
    live = dict(conn.execute("SELECT dispatcher_id, live FROM pepsi.queue_dispatchers()"))
    assert live == {slow: True, fast: False, plain: True}
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
    assert "(not live)" in lines[fast] and "(not live)" not in lines[slow] + lines[plain]
