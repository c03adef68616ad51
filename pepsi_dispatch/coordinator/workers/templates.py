"""A stage's template process: starts its workers by fork instead of exec.

A Python worker spends 0.15-0.2 s of CPU importing before it reads its first
id, once per MAX_MESSAGES and once per burst after the idle timeout. A stage
whose workers say (in their in-hand slot, CAN_TEMPLATE) that their program
can be a template gets one more process, started once as ``PROGRAM [-c FILE]
worker`` with ``PEPSI_TEMPLATE_FD``: it imports once, reads no ids, and
forks each new worker of the stage on request (the SDK's template also
passes database sessions from workers that ended to the next ones,
sdk/lending.py; nothing of that reaches the dispatcher). The request
carries the worker's stdin, stdout and stderr pipes and its in-hand slot; a
middle process exits at once, so the worker is
re-parented to the dispatcher (a child subreaper): it is our child like an
exec'd one, leads its own session and dies with the dispatcher (it sets
PDEATHSIG once we are its parent). The protocol is the SDK's (sdk/template.py).

Before that, a stage with no template offers one to each worker it execs
(:meth:`TemplateProcess.offer`, ``PEPSI_TEMPLATE_OFFER_FD``): an SDK worker
forks the template from itself before it connects, so the template is ready
with the stage's first worker instead of one interpreter start later, when
the workers are busy. It is adopted like a forked worker and greets with
``ready PID``. An offer nobody takes (a program that is not the SDK's) ends
quietly with its worker.

Anything wrong with a template (it does not answer, dies, refuses) ends it;
the stage then starts its workers by exec again, as before.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from typing import IO

from pepsi_dispatch.contract import TEMPLATE_ENV
from pepsi_dispatch.coordinator.workers.children import start_child
from pepsi_dispatch.coordinator.workers.inhand import InHandSlot

log = logging.getLogger(__name__)

#: How long a spawn request may take (the template forks twice; milliseconds).
SPAWN_TIMEOUT = 5.0
#: While it waits for a spawn's answer, how often the dispatcher looks whether
#: the template was stopped meanwhile (a stopped template never answers).
SPAWN_POLL = 0.02


class ForkedChild:
    """A worker a template forked, re-parented to us: the part of
    :class:`subprocess.Popen` a worker process uses."""

    def __init__(self, pid: int, stdin: int, stdout: int, stderr: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.stdin: IO[bytes] | None = os.fdopen(stdin, "wb", buffering=0)
        self.stdout: IO[bytes] | None = os.fdopen(stdout, "rb", buffering=0)
        self.stderr: IO[bytes] | None = os.fdopen(stderr, "rb", buffering=0)

    def _reaped(self, status: int) -> int:
        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        """Its exit status once it has exited (reaped without blocking), else None."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -9  # reaped elsewhere: gone, status unknown
                return self.returncode
            if pid:
                return self._reaped(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Block until it has exited (a SIGKILLed worker goes in milliseconds)."""
        if self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
            except ChildProcessError:
                self.returncode = -9
                return self.returncode
            return self._reaped(status)
        return self.returncode


class AdoptedTemplate:
    """A template a worker forked from itself, re-parented to us: what
    :meth:`TemplateProcess.close` needs of its process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait(self) -> int:
        if self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            except ChildProcessError:  # reaped as an orphan already
                self.returncode = -9
        return self.returncode


class TemplateProcess:
    """The dispatcher's end of one stage's template."""

    def __init__(self, argv: list[str], env: Mapping[str, str]) -> None:
        """Start it (OSError if it cannot start); it is ready once it said so."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc: subprocess.Popen[bytes] | AdoptedTemplate | None = start_child(
                argv, {**env, TEMPLATE_ENV: str(theirs.fileno())}, (theirs.fileno(),), pipes=False
            )
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        self.pid: int | None = self.proc.pid
        self.sock = mine
        self._ready = False

    @classmethod
    def offer(cls) -> tuple[TemplateProcess, socket.socket]:
        """A template to offer an exec'd worker: ours, and the socket end the
        worker gets (named by ``PEPSI_TEMPLATE_OFFER_FD``; close it once the
        worker is started). It has no process until it says ``ready PID``."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        template = cls.__new__(cls)
        template.proc, template.pid, template.sock, template._ready = None, None, mine, False
        return template, theirs

    @property
    def offered(self) -> bool:
        """An offer no worker has taken (yet): no process of its own."""
        return self.proc is None

    def ready(self) -> bool:
        """Has it said ``ready`` (never blocks)? False as well once it is closed."""
        if self._ready or self.sock.fileno() < 0:
            return self._ready
        readable, _, _ = select.select([self.sock], [], [], 0)
        if not readable:
            return False
        try:
            greeting = self.sock.recv(64)
        except OSError:
            greeting = b""
        self._ready = self._greeted(greeting)
        if not self._ready:
            self.close()
        return self._ready

    def _greeted(self, greeting: bytes) -> bool:
        """``ready``, or from a template a worker forked, ``ready PID``."""
        if self.proc is not None:
            return greeting == b"ready"
        word, _, pid = greeting.partition(b" ")
        if word != b"ready" or not pid.isdigit() or _parent_of(int(pid)) != os.getpid():
            return False  # only a child of ours is ever signalled or waited for
        self.pid = int(pid)
        self.proc = AdoptedTemplate(self.pid)
        return True

    def fork(self, slot: InHandSlot) -> ForkedChild:
        """A new worker with fresh pipes and ``slot``; OSError if the template
        cannot make one (the caller closes it and execs instead)."""
        assert slot.fd is not None
        if self.proc is not None and _stopped(self.proc.pid):
            # A stopped template (SIGSTOP, a debugger) would hold the loop for
            # SPAWN_TIMEOUT at every spawn: exec instead, at once.
            raise OSError(f"template pid {self.proc.pid} is stopped")
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        ours, theirs = (in_w, out_r, err_r), (in_r, out_w, err_w)
        try:
            self.sock.settimeout(SPAWN_TIMEOUT)
            socket.send_fds(self.sock, [b"spawn"], [*theirs, slot.fd])
            answer = self._answer()
        except BaseException:
            _close(ours)
            raise
        finally:
            _close(theirs)
        if not answer.isdigit():
            _close(ours)
            raise OSError(f"template pid {self.pid}: {answer.decode(errors='replace') or 'gone'}")
        return ForkedChild(int(answer), in_w, out_r, err_r)

    def _answer(self) -> bytes:
        """The template's answer to a spawn request. A template stopped in the
        middle of the spawn (SIGSTOP, a debugger, a frozen cgroup) never answers:
        it is given up within SPAWN_POLL, not after SPAWN_TIMEOUT, so the loop
        is held for milliseconds; OSError then (the caller execs instead)."""
        deadline = time.monotonic() + SPAWN_TIMEOUT
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"template pid {self.pid} did not answer a spawn in time")
            readable, _, _ = select.select([self.sock], [], [], min(left, SPAWN_POLL))
            if readable:
                return self.sock.recv(64)
            if self.proc is not None and _stopped(self.proc.pid):
                raise OSError(f"template pid {self.proc.pid} was stopped during a spawn")

    def close(self) -> None:
        """End it (it holds no ids; an idle session it keeps just closes) and reap it."""
        self.sock.close()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            self.proc.wait()


def _stat_fields(pid: int) -> list[bytes]:
    """The fields of /proc/PID/stat after ``(comm)``: state, ppid, ... ([] if gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return []
    # pid (comm) state ppid ...: comm may hold spaces and parentheses
    return stat[stat.rfind(b")") + 2 :].split()


def _stopped(pid: int) -> bool:
    """Is process ``pid`` stopped (state T, or t: traced)?"""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] in (b"T", b"t")


def _parent_of(pid: int) -> int | None:
    """The parent pid of process ``pid`` (None if there is no such process)."""
    fields = _stat_fields(pid)
    return int(fields[1]) if len(fields) > 1 else None


def _close(fds: tuple[int, ...]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


__all__ = ["AdoptedTemplate", "ForkedChild", "TemplateProcess"]
