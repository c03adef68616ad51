"""``bench_peer_drivers.wait_idle``: the side-by-side bench starts each service
and waits until it is idle before the backlog arrives (real processes, no database)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from pepsi_dispatch.devtools.bench.peer_drivers import wait_idle
from pepsi_dispatch.devtools.bench.proc import tree_cpu


def _spawn(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", code], stderr=subprocess.PIPE, start_new_session=True
    )


def test_returns_once_a_busy_start_is_over() -> None:
    """A service that computes for a while, then waits: wait_idle returns after the busy part."""
    proc = _spawn("import time\nt = time.time()\nwhile time.time() - t < 1.0: pass\ntime.sleep(60)")
    try:
        start = time.monotonic()
        wait_idle(proc, "busy-then-idle", quiet=0.3)
        waited = time.monotonic() - start
        assert waited >= 0.9, f"returned after {waited:.2f} s, while the start was still busy"
        cpu = tree_cpu(proc.pid)[1]
        time.sleep(0.3)
        assert tree_cpu(proc.pid)[1] == cpu  # it really is idle now
    finally:
        proc.kill()
        proc.wait()


def test_a_service_that_exits_while_starting_is_named() -> None:
    proc = _spawn("import sys\nsys.stderr.write('no database here')\nsys.exit(3)")
    with pytest.raises(SystemExit, match=r"toy-queue exited 3 while starting: no database here"):
        wait_idle(proc, "toy-queue")


def test_a_service_that_never_settles_times_out() -> None:
    proc = _spawn("while True: pass")
    try:
        with pytest.raises(SystemExit, match=r"spinner still busy 1 s after its start"):
            wait_idle(proc, "spinner", quiet=0.3, timeout=1)
    finally:
        proc.kill()
        proc.wait()
