"""A broken stage is visible everywhere: heartbeat -> stage_health -> pepsi-queue status,
/metrics, /healthz (503 past the held-off limit) -- and recovers when fixed.

Two ways a stage stays held off with its rows pending: a PROGRAM removed while the
dispatcher runs, and a Python program with no handler for its stage. Both were only
in the dispatcher's log before.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from dispatch_harness import PYTHON, VENV_BIN, Harness, harness_fixture, wait_until  # noqa: F401
from httpd_harness import Httpd

SDK_WORKER = Path(__file__).resolve().parents[1] / "support" / "workers" / "sdk_scripted_worker.py"
QUEUE = VENV_BIN / "pepsi-queue"


def health(h: Harness, stage: str) -> dict[str, Any] | None:
    row = h.conn.execute(
        "SELECT state, cause, held_seconds, pending FROM pepsi.stage_health() WHERE stage = %s",
        (stage,),
    ).fetchone()
    keys = ("state", "cause", "held_seconds", "pending")
    return dict(zip(keys, row, strict=True)) if row else None


def pq(h: Harness, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PEPSI_DSN": h.dsn}
    env.pop("PEPSI_CONFIG", None)
    return subprocess.run(
        [str(QUEUE), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def with_httpd_section(conf: Path, limit: str) -> Path:
    conf.write_text(conf.read_text() + f"\n[pepsi-httpd]\nHELD_OFF_LIMIT = {limit}\n")
    return conf


def test_removed_program_held_off_everywhere_then_serving(h: Harness, tmp_path: Path) -> None:
    prog = tmp_path / "stage-a"
    prog.write_text(f'#!/bin/sh\nexec {h.program({"a": "b"})} "$@"\n')
    prog.chmod(0o755)
    stages = h.pipeline(["a", "b"])
    stages["a"]["PROGRAM"] = str(prog)
    # POLL_INTERVAL 60 s (the harness default): the health must not wait for the heartbeat.
    conf = with_httpd_section(h.conf(stages), "3 s")
    d = h.start(conf)
    wait_until(lambda: (health(h, "a") or {}).get("state") == "serving", 10, 0.1, d.tail)
    srv = Httpd(conf, h.dsn, tmp_path / "httpd.log")
    try:
        assert srv.get("/healthz")[0] == 200
        prog.unlink()
        ids = h.enqueue("a", 3)
        t0 = time.monotonic()
        got = wait_until(
            lambda: (hl := health(h, "a")) and hl["state"] == "no_worker" and hl,
            10,
            0.1,
            lambda: f"stage a held off in stage_health; {health(h, 'a')}\n{d.tail()}",
        )
        # Within seconds of the change, not POLL_INTERVAL (60 s).
        assert time.monotonic() - t0 < 8
        assert "cannot start PROGRAM" in got["cause"] and str(prog) in got["cause"], got
        assert got["pending"] == 3
        assert all(h.row(i)["status"] == "pending" for i in ids)

        # pepsi-queue status: the health column and the cause.
        r = pq(h, "status")
        assert r.returncode == 0, r.stderr
        line_a = next(x for x in r.stdout.splitlines() if x.startswith("a "))
        assert "NO WORKER" in line_a, r.stdout
        assert "stage a: held off, no worker running since" in r.stdout
        assert "cannot start PROGRAM" in r.stdout and "NO LIVE DISPATCHER" not in r.stdout
        js = json.loads(pq(h, "status", "--json").stdout)
        assert js["a"]["health"]["state"] == "no_worker"
        assert js["b"]["health"] == {"state": "serving"}
        assert js["b"]["pending"] == 0 and js["b"]["expired"] == 0  # zeros are there

        # /metrics: the per-stage gauge (a scrape may be served from the snapshot
        # cached up to a second before the change).
        metrics = wait_until(
            lambda: (
                (m := srv.get("/metrics")[2])
                and 'pepsi_stage_health{stage="a",state="no_worker"} 1.0' in m
                and m
            ),
            10,
            0.2,
            lambda: srv.get("/metrics")[2],
        )
        assert 'pepsi_stage_health{stage="a",state="serving"} 0.0' in metrics
        assert 'pepsi_stage_health{stage="b",state="serving"} 1.0' in metrics

        # /healthz: 503 naming the stage and the cause once held off past 3 s.
        def unhealthy():
            status, _, body = srv.get("/healthz")
            return status == 503 and body

        body = wait_until(unhealthy, 15, 0.2, lambda: srv.get("/healthz")[2])
        assert "stage a no worker" in body and "3 pending" in body, body
        assert "cannot start PROGRAM" in body, body

        # Fixed: the next cooldown's end starts a worker, it answers, the stage serves.
        prog.write_text(f'#!/bin/sh\nexec {h.program({"a": "b"})} "$@"\n')
        prog.chmod(0o755)
        h.wait_all(timeout=90)
        wait_until(lambda: health(h, "a")["state"] == "serving", 10, 0.1)
        wait_until(lambda: srv.get("/healthz")[0] == 200, 10, 0.2, lambda: srv.get("/healthz")[2])
    finally:
        srv.stop()
    d.terminate()
    r = pq(h, "status")
    assert "NO LIVE DISPATCHER" in r.stdout, r.stdout


def test_python_program_without_the_handler_is_held_off(h: Harness) -> None:
    stages = {"b": {"PROGRAM": f"{PYTHON} {SDK_WORKER} --stages x"}}
    conf = h.conf(stages)
    d = h.start(conf)
    h.enqueue("b", 2)
    # The cause quotes what the worker said on stderr (the real reason) once it was read.
    got = wait_until(
        lambda: (
            (hl := health(h, "b"))
            and hl["state"] in ("held_off", "no_worker")
            and "no handler for stage b" in (hl["cause"] or "")
            and hl
        ),
        30,
        0.1,
        lambda: f"{health(h, 'b')}\n{d.tail()}",
    )
    assert "before reading its input" in got["cause"], got
    assert h.counts().get("pending") == 2


#: What node v20 writes to stderr when a stage's ``require('pg')`` finds no module.
NODE_MISSING_MODULE = """node:internal/modules/cjs/loader:1210
  throw err;
  ^

Error: Cannot find module 'pg'
Require stack:
- /srv/stages/store.js
    at Module._resolveFilename (node:internal/modules/cjs/loader:1207:15)
    at Module._load (node:internal/modules/cjs/loader:1038:27)
    at Module.require (node:internal/modules/cjs/loader:1289:19)
    at require (node:internal/modules/helpers:182:18)
    at Object.<anonymous> (/srv/stages/store.js:1:12)
    at Module._compile (node:internal/modules/cjs/loader:1521:14)
    at Module._extensions..js (node:internal/modules/cjs/loader:1623:10)
    at Module.load (node:internal/modules/cjs/loader:1266:32)
    at Module._load (node:internal/modules/cjs/loader:1091:12)
    at Function.executeUserEntryPoint [as runMain] (node:internal/modules/run_main:164:12) {
  code: 'MODULE_NOT_FOUND',
  requireStack: [ '/srv/stages/store.js' ]
}

Node.js v20.20.2
"""


def test_stage_dying_at_start_shows_its_error_not_its_version_banner(
    h: Harness, tmp_path: Path
) -> None:
    report = tmp_path / "node-crash.txt"
    report.write_text(NODE_MISSING_MODULE)
    prog = tmp_path / "store-stage"
    prog.write_text(f"#!/bin/sh\ncat {report} >&2\nexit 1\n")
    prog.chmod(0o755)
    d = h.start(h.conf({"store": {"PROGRAM": str(prog)}}))
    h.enqueue("store", 2)
    error = "Error: Cannot find module 'pg'"
    got = wait_until(
        lambda: (hl := health(h, "store")) and error in (hl["cause"] or "") and hl,
        30,
        0.1,
        lambda: f"{health(h, 'store')}\n{d.tail()}",
    )
    assert "MODULE_NOT_FOUND" in got["cause"] and "Node.js v20" not in got["cause"], got
    # The log line an operator filters for (journalctl -p warning) carries the error.
    warnings = [x for x in d.log().splitlines() if "WARNING" in x and "holding off" in x]
    assert warnings and error in warnings[0] and "Node.js v20" not in warnings[0], d.tail()
    r = pq(h, "status")
    held = next(x for x in r.stdout.splitlines() if x.startswith("stage store:"))
    assert error in held and "Node.js v20" not in held, r.stdout
    assert h.counts().get("pending") == 2
