"""The group sentinel alone (coordinator/workers/sentinel.py): what it kills at EOF."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from pepsi_dispatch.coordinator.workers.sentinel import GroupSentinel, read_groups

SLEEPER = [sys.executable, "-c", "import time\nwhile True: time.sleep(0.2)"]


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def group() -> Iterator[subprocess.Popen[bytes]]:
    """A sacrificial process group: a leader in a session of its own."""
    p = subprocess.Popen(SLEEPER, start_new_session=True)
    try:
        yield p
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)


def comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


def test_eof_kills_the_groups_still_recorded(group: subprocess.Popen[bytes]) -> None:
    s = GroupSentinel.start()
    assert s.running and s.pid
    assert wait_for(lambda: comm(s.pid) == "pepsi-sentinel")
    s.watch(group.pid)
    s.close()  # EOF, as when the dispatcher dies
    assert wait_for(lambda: group.poll() is not None), "the group outlived the sentinel's EOF"
    assert group.returncode == -signal.SIGKILL


def test_a_forgotten_group_is_left_alone(group: subprocess.Popen[bytes]) -> None:
    s = GroupSentinel.start()
    pid = s.pid
    s.watch(group.pid)
    s.forget(group.pid)
    s.close()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # close() reaped it: it has seen EOF and exited
    assert group.poll() is None


def test_it_ignores_stop_signals_and_a_dead_one_is_a_warning_once(
    group: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    s = GroupSentinel.start()
    pid = s.pid
    assert wait_for(lambda: comm(pid) == "pepsi-sentinel")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGTSTP):
        os.kill(pid, sig)
    s.watch(group.pid)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert s.reaped(pid)  # the dispatcher's reap_orphans reaped it
    assert not s.running
    s.watch(group.pid)  # no-ops from now on
    s.forget(group.pid)
    s.close()
    assert [r.levelname for r in caplog.records if "sentinel" in r.getMessage()] == ["WARNING"]
    assert group.poll() is None


def test_a_broken_pipe_is_a_warning_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    s = GroupSentinel.start()
    pid = s.pid
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    s.watch(12345)  # EPIPE
    s.watch(12346)
    assert not s.running
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1
    s.close()


def test_read_groups_applies_lines_across_reads() -> None:
    r, w = os.pipe()
    os.write(w, b"+100\n+200\n-10")
    os.write(w, b"0\n+300\nbogus\n+1\n-\n+40")  # a last line without newline is ignored
    os.close(w)
    try:
        assert read_groups(r) == {200, 300}
    finally:
        os.close(r)


def test_an_unstarted_sentinel_does_nothing() -> None:
    s = GroupSentinel()
    s.watch(os.getpid())
    s.forget(os.getpid())
    assert not s.reaped(0)
    s.close()
