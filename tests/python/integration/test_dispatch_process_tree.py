"""The process tree when the dispatcher is killed -9: a worker leads its own process
group, and before any id of a dead worker can be handed out again the whole group must
be gone -- including a grandchild that ignores SIGTERM and outlives its worker.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from dispatch_harness import (  # noqa: F401
    Harness,
    children_of,
    harness_fixture,
    pid_alive,
    proc_env,
    wait_until,
)

#: A stage program that, for its first message, forks a grandchild in its own process
#: group (no setsid, no setpgid) that ignores SIGTERM and SIGHUP, writes its pid to a
#: file and keeps "working" on the message; the worker itself then just waits.
FORKING_WORKER = """\
import os, signal, sys, time
pidfile = sys.argv[1]
line = sys.stdin.readline()
child = os.fork()
if child == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with open(pidfile + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pidfile + ".tmp", pidfile)
    while True:
        time.sleep(0.2)
while True:
    time.sleep(0.2)
"""


def test_kill9_of_the_dispatcher_kills_a_workers_grandchild(h: Harness, tmp_path: Path) -> None:
    script = tmp_path / "forking_worker.py"
    script.write_text(FORKING_WORKER)
    pidfile = tmp_path / "grandchild.pid"
    program = f"{Path(h.program().split()[0])} {script} {pidfile}"
    conf = h.conf({"a": {"PROGRAM": program, "PARALLELISM": 1}})
    d = h.start(conf)
    grandchild = 0
    try:
        h.enqueue("a", 1)
        wait_until(pidfile.exists, 30, message="the grandchild's pid file")
        grandchild = int(pidfile.read_text())
        worker = d.workers()["a"][0]
        assert os.getpgid(grandchild) == worker, "the grandchild is in its worker's group"
        d.kill9()
        # the grandchild may not run on (and the id is handed out again) by itself
        wait_until(
            lambda: not pid_alive(worker) and not pid_alive(grandchild),
            10,
            message=lambda: (
                f"worker {worker} alive: {pid_alive(worker)}, "
                f"grandchild {grandchild} alive: {pid_alive(grandchild)}\n{d.tail()}"
            ),
        )
        said = f"killed process group {worker} of a worker"
        wait_until(lambda: said in d.log(), 10, message=lambda: f"{said!r} in\n{d.tail()}")
    finally:
        if grandchild and pid_alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def sentinels_of(pid: int) -> list[int]:
    out = []
    for child in children_of(pid):
        try:
            with open(f"/proc/{child}/comm") as f:
                if f.read().strip() == "pepsi-sentinel":
                    out.append(child)
        except OSError:
            pass
    return out


def test_a_clean_stop_leaves_the_sentinel_nothing_to_kill(h: Harness, tmp_path: Path) -> None:
    """SIGTERM: the dispatcher kills the group itself (the grandchild ignores SIGTERM),
    tells the sentinel, and the sentinel exits at EOF without killing anything."""
    script = tmp_path / "forking_worker.py"
    script.write_text(FORKING_WORKER)
    pidfile = tmp_path / "grandchild.pid"
    program = f"{Path(h.program().split()[0])} {script} {pidfile}"
    conf = h.conf({"a": {"PROGRAM": program, "PARALLELISM": 1}}, SHUTDOWN_TIMEOUT="2 s")
    d = h.start(conf)
    grandchild = 0
    try:
        sentinel = wait_until(lambda: sentinels_of(d.pid), 10, message="the sentinel")[0]
        assert "PEPSI_STAGE" not in proc_env(sentinel)  # not counted as a worker
        assert os.getpgid(sentinel) == sentinel  # out of the dispatcher's group
        h.enqueue("a", 1)
        wait_until(pidfile.exists, 30, message="the grandchild's pid file")
        grandchild = int(pidfile.read_text())
        assert list(d.workers()) == ["a"] and len(d.workers()["a"]) == 1
        assert d.terminate() == 0
        wait_until(lambda: not pid_alive(grandchild), 10, message="the grandchild's end")
        wait_until(lambda: not pid_alive(sentinel), 10, message="the sentinel's end")
        assert "pepsi-sentinel" not in d.log()
        assert "group sentinel" not in d.log()
    finally:
        if grandchild and pid_alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_a_dead_sentinel_is_a_warning_and_the_dispatcher_serves_on(h: Harness) -> None:
    conf = h.conf(h.pipeline(["a"]))
    d = h.start(conf)
    (sentinel,) = wait_until(lambda: sentinels_of(d.pid), 10, message="the sentinel")
    os.kill(sentinel, signal.SIGKILL)
    # noticed when it is reaped ("exited"), or first when a worker's group is
    # handed to it ("is gone": the stage's template probe, started with the
    # dispatcher, may be that worker)
    wait_until(
        lambda: "group sentinel exited" in d.log() or "group sentinel is gone" in d.log(),
        10,
        message=lambda: d.tail(),
    )
    wait_until(lambda: not pid_alive(sentinel), 10, message="the sentinel reaped")
    h.enqueue("a", 3)
    h.wait_all("done", timeout=30)
    assert d.terminate() == 0
    assert d.log().count("group sentinel") == 1, d.tail()
