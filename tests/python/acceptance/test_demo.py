"""`make demo`'s driver (python -m pepsi_dispatch.devtools.demo) against a throwaway database."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def processes_with(marker: str) -> list[int]:
    """Pids of live processes whose environment contains `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in environ and state != "Z":
            found.append(int(entry.name))
    return found


def run_demo(dsn: str, marker: str, messages: int = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PEPSI_DSN": dsn, "PEPSI_DEMO_TEST_MARKER": marker}
    env.pop("PEPSI_CONFIG", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pepsi_dispatch.devtools.demo",
            "--messages",
            str(messages),
            "--timeout",
            "120",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_demo_runs_end_to_end_and_leaves_nothing_behind(dsn):
    marker = f"demo-{uuid.uuid4().hex}"
    for attempt in range(2):  # re-runnable against the same database
        result = run_demo(dsn, marker)
        out = result.stdout
        assert result.returncode == 0, f"demo failed:\n{out}\n{result.stderr}"
        assert "demo: enqueued 300 documents" in out
        assert " msg/s" in out  # progress lines
        assert "Summary" in out and "stage_stats (this run):" in out
        assert "dispatch_stats (this run): stage_runs" in out
        assert "dispatcher exited 0" in out
        # 300 documents: 7 malformed (every 41st), 3 never available (every 97th)
        assert "messages: done 290, failed 10 of 300" in out, out
        assert "docpipe.invoices: 290 rows stored" in out
        assert "retries exhausted" in out and "malformed document" in out
        # It ends with what to try next on this database.
        assert "pepsi-httpd --allow-actions" in out and "http://127.0.0.1:9187/" in out
        assert "pepsi-queue failed --by-reason" in out and "pepsi-queue show " in out
        deadline = time.monotonic() + 5
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_with(marker) == [], f"stray processes after run {attempt + 1}"


def test_demo_without_dsn_says_how():
    env = {k: v for k, v in os.environ.items() if k != "PEPSI_DSN"}
    result = subprocess.run(
        [sys.executable, "-m", "pepsi_dispatch.devtools.demo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "PEPSI_DSN is not set" in result.stderr


@pytest.mark.skipif(
    not os.environ.get("PEPSI_SLOW_TESTS"),
    reason="clones the repository and builds a venv (network); set PEPSI_SLOW_TESTS=1",
)
def test_make_demo_from_a_fresh_clone(tmp_path: Path):
    """`make demo` as a new user runs it: fresh clone, no PEPSI_DSN, embedded cluster."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEPSI_")}
    env["PEPSI_DEMO_TEST_MARKER"] = marker = f"fresh-{uuid.uuid4().hex}"
    try:
        result = subprocess.run(
            ["make", "demo"], cwd=clone, env=env, capture_output=True, text=True, timeout=900
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "Summary" in result.stdout and "dispatcher exited 0" in result.stdout
        assert "pepsi-httpd --allow-actions" in result.stdout
    finally:
        subprocess.run(["make", "stop-db"], cwd=clone, env=env, capture_output=True, timeout=120)
    assert processes_with(marker) == []
