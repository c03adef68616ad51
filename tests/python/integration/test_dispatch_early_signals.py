"""A SIGHUP or SIGTERM in the dispatcher's first fraction of a second.

Before the loop installs its handlers, `pepsi-dispatch serve` imports, loads the
configuration, opens its log and drops root. A signal in that window used to kill
it by the signal (exit -1 / -15; seen in the chaos soak's exit table). Now
the command line's main records it and the loop takes it over: a SIGHUP is a reload, a SIGTERM a
clean stop (exit 0).

To hold the dispatcher in that window for as long as the test needs, its log
file (-l) is a FIFO: opening it for writing blocks until the test opens the
reading end. The signal is sent while it is blocked there, after the early
handlers are in place when there are any (SigCgt in /proc), and the window is
checked to be still open (the loop catches SIGCHLD; the early handlers do not).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from dispatch_harness import Dispatcher, Harness, harness_fixture, wait_until  # noqa: F401


def _caught(pid: int) -> set[int]:
    """Signals the process has a handler for (SigCgt)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("SigCgt:"):
                mask = int(line.split()[1], 16)
                return {s for s in range(1, 65) if mask >> (s - 1) & 1}
    return set()


class _FifoLog:
    """The dispatcher's -l file: a FIFO, read into `text` once the test opens it."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = path
        self.chunks: list[bytes] = []
        self.thread: threading.Thread | None = None

    def open_and_drain(self) -> None:
        fd = os.open(self.path, os.O_RDONLY)  # the dispatcher's open for writing returns

        def drain() -> None:
            with os.fdopen(fd, "rb", buffering=0) as f:
                while chunk := f.read(65536):
                    self.chunks.append(chunk)

        self.thread = threading.Thread(target=drain, daemon=True)
        self.thread.start()

    @property
    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")


def _start_held(h: Harness) -> tuple[Dispatcher, _FifoLog]:
    """A dispatcher held before its loop (blocked opening its FIFO log)."""
    log = _FifoLog(h.tmp / "dispatcher.fifo")
    conf = h.conf(h.pipeline(["a"]))
    d = h.start(conf, wait=False, args=["-l", str(log.path)])
    # Wait for the early handlers (present only with the fix): up to 5 s, then the
    # signal goes anyway; the FIFO keeps the loop from starting in any case.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and signal.SIGTERM not in _caught(d.pid):
        assert d.running(), f"dispatcher exited with {d.proc.returncode}:\n{d.tail()}"
        time.sleep(0.005)
    assert signal.SIGCHLD not in _caught(d.pid), "the loop's handlers are in already"
    return d, log


def test_early_sighup_is_a_reload(h: Harness) -> None:
    d, log = _start_held(h)
    d.proc.send_signal(signal.SIGHUP)
    time.sleep(0.2)  # a default action would have killed it by now
    assert d.running(), f"early SIGHUP killed the dispatcher (exit {d.proc.returncode})"
    log.open_and_drain()
    d.wait_ready(h.conn)
    wait_until(lambda: "configuration reloaded" in log.text, 15, message=lambda: log.text)
    (wq_id,) = h.enqueue("a", 1)
    h.wait_all(timeout=30)
    assert h.row(wq_id)["status"] == "done"
    d.proc.send_signal(signal.SIGTERM)
    assert d.wait_exit(30) == 0, log.text


def test_early_sigterm_is_a_clean_stop(h: Harness) -> None:
    d, log = _start_held(h)
    d.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    assert d.running(), f"early SIGTERM killed the dispatcher (exit {d.proc.returncode})"
    log.open_and_drain()
    rc = d.wait_exit(30)
    assert rc == 0, f"exit {rc}:\n{log.text}"
    assert "stop signal before start-up" in log.text, log.text
    assert d.dispatcher_id(h.conn) is None  # it never registered
