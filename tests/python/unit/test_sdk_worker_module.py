"""Unit tests of the SDK (no database): the stable public import path, pepsi_dispatch.worker."""

from __future__ import annotations

import os

import pytest


def test_worker_module_is_the_stable_public_path() -> None:
    from pepsi_dispatch import worker
    from pepsi_dispatch.sdk import entry, lending, message

    assert worker.__all__ == [
        "Advance",
        "Fail",
        "Finish",
        "Handler",
        "Message",
        "Pause",
        "Transition",
        "connect",
        "fork_point",
        "leave",
        "run",
    ]
    assert worker.run is entry.run and worker.Message is message.Message
    assert worker.leave is entry.leave
    assert worker.fork_point is entry.fork_point
    assert worker.connect is lending.connect
    assert (worker.EX_TEMPFAIL, worker.MAX_REASON) == (75, 2000)
    assert worker.RECONNECT_TIMEOUT > 0


def test_fork_point_in_a_worker_sets_only_the_capability_word(tmp_path, monkeypatch) -> None:
    """In a worker, fork_point() returns at once and sets the "can be a template"
    bit in the slot's second word; the first word stays untouched (0: the slot
    is not used for blame) and PEPSI_INHAND_FD stays for a later run()."""
    import struct

    from pepsi_dispatch.contract import CAN_TEMPLATE, INHAND_ENV, INHAND_WORD, TEMPLATE_ENV
    from pepsi_dispatch.sdk import entry

    slot = tmp_path / "slot"
    slot.write_bytes(bytes(16))
    fd = os.open(slot, os.O_RDWR)
    try:
        monkeypatch.setenv(INHAND_ENV, str(fd))
        monkeypatch.delenv(TEMPLATE_ENV, raising=False)
        entry.fork_point()
        first, caps = struct.unpack("=" + INHAND_WORD.lstrip("=@") * 2, slot.read_bytes())
        assert (first, caps) == (0, CAN_TEMPLATE)
        assert os.environ[INHAND_ENV] == str(fd)
    finally:
        os.close(fd)


def test_fork_point_without_a_slot_does_nothing(monkeypatch) -> None:
    from pepsi_dispatch.contract import INHAND_ENV, TEMPLATE_ENV
    from pepsi_dispatch.sdk import entry

    monkeypatch.delenv(INHAND_ENV, raising=False)
    monkeypatch.delenv(TEMPLATE_ENV, raising=False)
    entry.fork_point()  # returns; nothing to announce to


LEAVING = """
import atexit, sys, threading, time
from pepsi_dispatch.worker import leave
atexit.register(lambda: print("atexit ran", file=sys.stderr, flush=True))
def late():
    time.sleep(0.2)
    print("thread finished", file=sys.stderr, flush=True)
threading.Thread(target=late).start()
sys.stdout.write("buffered, no newline")  # flushed by leave, not lost
leave(3)
print("never")
"""


@pytest.mark.parametrize("hook", ["kept", "missing"])
def test_leave_waits_for_threads_runs_atexit_flushes_and_keeps_the_status(hook: str) -> None:
    """leave() skips only the interpreter's teardown: the program's own threads,
    its atexit functions and buffered output are not lost, and the status is kept
    -- also on an interpreter without CPython's atexit hook (the usual exit then)."""
    import subprocess
    import sys

    program = LEAVING if hook == "kept" else "import atexit; del atexit._run_exitfuncs" + LEAVING
    r = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=30, check=False
    )
    assert r.returncode == 3, r
    assert r.stdout == "buffered, no newline", r.stdout
    assert r.stderr.index("thread finished") < r.stderr.index("atexit ran"), r.stderr


def test_a_handlers_sys_exit_keeps_its_status() -> None:
    from pepsi_dispatch.sdk.entry import _exit_status

    assert _exit_status(None) == 0
    assert _exit_status(4) == 4
    assert _exit_status("bye") == 1  # sys.exit("text"): printed, status 1


@pytest.mark.parametrize(
    "argv",
    [
        ["worker"],
        ["-c", "/etc/pepsi.conf", "worker"],
        ["--config", "pepsi.conf", "worker"],
        ["-c", "", "worker"],
        ["--config=pepsi.conf", "worker"],
        ["worker", "-c", "pepsi.conf"],
    ],
)
def test_the_dispatchers_argv_reads_as_argparse_reads_it(argv) -> None:
    """The forms the dispatcher uses are read without building the parser, to
    the same result; the others go through argparse."""
    from pepsi_dispatch.sdk import entry

    parser = __import__("argparse").ArgumentParser()
    parser.add_argument("-c", "--config")
    parser.add_argument("command", choices=["worker"])
    assert entry._parse_argv(argv) == parser.parse_args(argv)


@pytest.mark.parametrize(
    "argv", [[], ["serve"], ["-c", "-x", "worker"], ["-c", "a.conf"], ["worker", "worker"]]
)
def test_a_command_line_not_the_dispatchers_is_refused_with_usage(argv, capsys) -> None:
    from pepsi_dispatch.sdk import entry

    with pytest.raises(SystemExit) as exc:
        entry._parse_argv(argv)
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err
