"""Resource exhaustion: the dispatcher at its open-file limit, its log file on a full
filesystem, PostgreSQL at max_connections. Each: a clear log line, no crash (loop),
nothing lost. Real processes, real limits (prlimit, a small tmpfs, a throwaway
cluster); each test takes a few seconds.
"""

from __future__ import annotations

import os
import resource
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from dispatch_harness import Harness, harness_fixture, wait_until  # noqa: F401

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (prlimit, mount)")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@ROOT_ONLY
def test_the_dispatcher_at_its_open_file_limit_keeps_serving(h: Harness) -> None:
    """Spawning a worker needs pipes; at the open-file limit that fails with EMFILE.
    The stage is held off with a log line saying why, the workers that did start
    serve, and once descriptors are free again every message is done."""
    conf = h.conf(h.pipeline(["a"], PARALLELISM=4, QUEUE_LIMIT=1))
    d = h.start(conf)
    n = open_fds(d.pid)
    # Room for about one worker (its three pipe ends, plus the spawn's own pipes).
    _soft, hard = resource.prlimit(d.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(d.pid, resource.RLIMIT_NOFILE, (n + 9, hard))
    ids = h.enqueue("a", [{"sleep": 0.05}] * 40)
    wait_until(
        lambda: "Too many open files" in d.log() or not d.running(),
        20,
        0.1,
        lambda: "EMFILE at a spawn\n" + d.tail(),
    )
    assert d.running(), d.tail()
    line = next(ln for ln in d.log().splitlines() if "Too many open files" in ln)
    assert "WARNING" in line or "ERROR" in line, line
    resource.prlimit(d.pid, resource.RLIMIT_NOFILE, (_soft, hard))
    h.wait_all(where=f"workqueue_id <= {max(ids)}", timeout=60)
    assert [h.row(i)["status"] for i in ids] == ["done"] * len(ids)
    assert d.running() and d.terminate() == 0


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MB tmpfs, unmounted afterwards."""
    mnt = tmp_path / "smallfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(fs: Path) -> Path:
    """Fill ``fs`` to the last block; returns the filler file."""
    filler = fs / "filler"
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={filler}", "bs=4k"], capture_output=True, check=False
    )
    return filler


@ROOT_ONLY
def test_a_full_log_filesystem_never_stops_the_dispatcher(h: Harness, small_fs: Path) -> None:
    """-l LOGFILE on a filesystem that fills up: one line on stderr says so, log lines
    are dropped and counted, every message is still done, and once space returns the
    file says how many lines were lost."""
    logfile = small_fs / "dispatch.log"
    conf = h.conf(h.pipeline(["a", "b"]))
    d = h.start(conf, args=["-l", str(logfile)], level="DEBUG")  # DEBUG: many lines
    filler = fill(small_fs)
    ids = h.enqueue("a", 30)
    h.wait_all(where=f"workqueue_id <= {max(ids)}", timeout=60)
    assert [h.row(i)["status"] for i in ids] == ["done"] * len(ids)
    assert d.running()
    stderr = d.log()  # the harness captures stdout and stderr
    assert f"log file {logfile}: cannot write (No space left on device)" in stderr, stderr
    assert stderr.count("cannot write") == 1 and "Traceback" not in stderr, stderr
    filler.unlink()
    more = h.enqueue("a", 3)
    h.wait_all(where=f"workqueue_id <= {max(more)}", timeout=30)
    wait_until(lambda: "dropped while it could not be written" in logfile.read_text(), 10)
    assert "written again" in d.log()
    assert d.terminate() == 0
