"""``pepsi-queue pause STAGE`` / ``resume STAGE`` under the pepsi_operator role,
against a real dispatcher, and "try now": a resume, or a SIGHUP, ends a stage's
hold-off at once.

A paused stage claims nothing (its rows stay pending) and shows as paused in
``pepsi-queue status`` and on /metrics; resuming lets them run. A stage whose
program exits at start is held off for a cooldown that doubles up to 60 s;
once the program is fixed, ``pepsi-queue resume`` (or a SIGHUP) starts it at
once instead of at the cooldown's end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from dispatch_harness import (  # noqa: F401
    VENV_BIN,
    Dispatcher,
    Harness,
    harness_fixture,
    wait_until,
)
from httpd_harness import Httpd
from psycopg.conninfo import make_conninfo

#: The cooldown the hold-off tests wait for before fixing the program (seconds):
#: long enough that a message done within it cannot have waited for its end.
COOLDOWN = 8


@pytest.fixture
def operator_dsn(h: Harness) -> Iterator[str]:
    """A login role that is a member of pepsi_operator only; dropped after."""
    name = f"op_{uuid.uuid4().hex[:8]}"
    h.conn.execute(f"CREATE ROLE {name} LOGIN IN ROLE pepsi_operator")
    yield make_conninfo(h.dsn, user=name)
    h.conn.execute(f"DROP OWNED BY {name}")
    h.conn.execute(f"DROP ROLE {name}")


def pq(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PEPSI_DSN": dsn}
    env.pop("PEPSI_CONFIG", None)
    return subprocess.run(
        [str(VENV_BIN / "pepsi-queue"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def health_of(dsn: str, stage: str) -> str | None:
    return (
        json.loads(pq(dsn, "status", "--json").stdout).get(stage, {}).get("health", {}).get("state")
    )


def test_operator_pauses_and_resumes_a_stage(h: Harness, operator_dsn: str, tmp_path: Path) -> None:
    conf = h.conf(h.pipeline(["a", "b"]))
    d = h.start(conf)
    r = pq(operator_dsn, "pause", "b")
    assert r.returncode == 0, r.stderr
    assert "paused stage b" in r.stdout, r.stdout
    wait_until(lambda: "configuration reloaded" in d.log(), 10, 0.05, d.tail)
    ids = h.enqueue("a", 3)
    # a runs; b claims nothing: the rows wait at b, pending.
    wait_until(lambda: h.counts() == {"pending": 3}, 20, 0.1, lambda: f"{h.counts()}\n{d.tail()}")
    wait_until(lambda: all(h.row(i)["stage"] == "b" for i in ids), 10, 0.1)
    time.sleep(1.0)
    assert all(h.row(i)["status"] == "pending" for i in ids)
    # Shown as paused: pepsi-queue status (table and JSON) and /metrics.
    wait_until(lambda: health_of(operator_dsn, "b") == "paused", 10, 0.2)
    line_b = next(x for x in pq(operator_dsn, "status").stdout.splitlines() if x.startswith("b "))
    assert line_b.rstrip().endswith("paused"), line_b
    srv = Httpd(conf, h.dsn, tmp_path / "httpd.log")
    try:
        metrics = srv.get("/metrics")[2]
        assert 'pepsi_stage_paused{stage="b"} 1.0' in metrics, metrics
        assert 'pepsi_stage_health{stage="b",state="paused"} 1.0' in metrics
        assert 'pepsi_stage_paused{stage="a"} 0.0' in metrics
    finally:
        srv.stop()
    # Again: nothing changes. A stage the dispatcher does not serve: refused, exit 2.
    assert "was paused already" in pq(operator_dsn, "pause", "b").stdout
    r = pq(operator_dsn, "pause", "bb")
    assert r.returncode == 2 and "unknown stage bb" in r.stderr and "'b'" in r.stderr, r.stderr
    # Resumed: the rows run.
    r = pq(operator_dsn, "resume", "b")
    assert r.returncode == 0 and "resumed stage b" in r.stdout, r.stderr
    h.wait_all(timeout=30)
    assert all(h.row(i)["status"] == "done" for i in ids)
    wait_until(lambda: health_of(operator_dsn, "b") == "serving", 10, 0.2)
    assert "was not paused" in pq(operator_dsn, "resume", "b").stdout


def _held_off_then_fixed(h: Harness, tmp_path: Path) -> tuple[Dispatcher, list[int], float]:
    """Stage a, whose program exits at start, held off until a cooldown of
    COOLDOWN s or more begins; then its program is fixed. Returns the
    dispatcher, the message's id and when that cooldown was seen (monotonic:
    it ends no later than COOLDOWN s after)."""
    prog = tmp_path / "stage-a"
    prog.write_text("#!/bin/sh\necho 'cannot start: config missing' >&2\nexit 3\n")
    prog.chmod(0o755)
    d = h.start(h.conf({"a": {"PROGRAM": str(prog)}}))
    ids = h.enqueue("a", 1)
    pattern = re.compile(r"stage a: .*holding off new workers for (\d+) s")

    def long_cooldown() -> bool:
        return any(int(m.group(1)) >= COOLDOWN for m in pattern.finditer(d.log()))

    wait_until(long_cooldown, 60, 0.05, d.tail)
    seen = time.monotonic()
    # The failed start gives its claimed row back; that may land just after the log line.
    wait_until(lambda: h.row(ids[0])["status"] == "pending", 5, 0.02, d.tail)
    assert h.row(ids[0])["status"] == "pending"
    prog.write_text(f'#!/bin/sh\nexec {h.program()} "$@"\n')
    return d, ids, seen


def _done_within_the_hold_off(
    h: Harness, d: Dispatcher, ids: list[int], seen: float, act: Callable[[], None]
) -> None:
    offset = len(d.log())
    act()
    wait_until(
        lambda: h.row(ids[0])["status"] == "done",
        COOLDOWN,
        0.05,
        lambda: f"the message done within the hold-off\n{d.tail()}",
    )
    assert time.monotonic() - seen < COOLDOWN
    after = d.log()[offset:]
    assert "hold-off ended" in after and "cooldown over" not in after, after


def test_resume_ends_the_hold_off_of_a_fixed_program(h: Harness, tmp_path: Path) -> None:
    d, ids, seen = _held_off_then_fixed(h, tmp_path)
    assert health_of(h.dsn, "a") in ("held_off", "no_worker")

    def resume() -> None:
        r = pq(h.dsn, "resume", "a")
        assert r.returncode == 0 and "was not paused" in r.stdout, r.stderr

    _done_within_the_hold_off(h, d, ids, seen, resume)
    assert "stage a: hold-off ended (resumed)" in d.log()
    wait_until(lambda: health_of(h.dsn, "a") == "serving", 10, 0.2)


def test_sighup_ends_every_hold_off(h: Harness, tmp_path: Path) -> None:
    d, ids, seen = _held_off_then_fixed(h, tmp_path)
    _done_within_the_hold_off(h, d, ids, seen, lambda: os.kill(d.pid, signal.SIGHUP))
    assert "stage a: hold-off ended (SIGHUP)" in d.log()


def test_the_dashboard_role_resumes_through_the_same_function(h: Harness) -> None:
    """pepsi-httpd's role calls pause_stage too; dashboard_pause_stage is gone."""
    h.conn.execute(
        "SELECT pepsi.register_stages(NULL, ARRAY['a'], NULL, NULL, NULL, NULL, NULL, NULL)"
    )
    with psycopg.connect(h.dsn, autocommit=True) as c:
        c.execute("SET ROLE pepsi_dashboard")
        assert c.execute("SELECT pepsi.pause_stage('a', true)").fetchone() == (True,)
        assert c.execute("SELECT pepsi.pause_stage('a', false)").fetchone() == (True,)
        with pytest.raises(psycopg.errors.UndefinedFunction):
            c.execute("SELECT pepsi.dashboard_pause_stage('a', true)")
