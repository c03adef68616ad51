"""The template process: a stage program that has imported everything once and
forks each new worker of its stage, so that a replacement costs a fork and a
connect instead of an interpreter's start.

A dispatcher that uses templates starts ``PROGRAM [-c FILE] worker`` once more
per stage with ``PEPSI_TEMPLATE_FD`` naming one end of a Unix seqpacket socket.
The SDK then serves that socket instead of stdin:

* it sends ``ready`` once the program's modules are imported;
* each request is ``spawn`` with four file descriptors attached: the new
  worker's stdin, stdout and stderr and its in-hand slot. It forks twice: the
  middle process exits at once, so the worker is re-parented to the
  dispatcher (a child subreaper) and is the dispatcher's child like any other.
  The worker leads a session of its own, waits until the dispatcher is its
  parent, asks the kernel to SIGKILL it when the dispatcher dies, then runs
  like a worker started by exec. The answer is the worker's pid in decimal,
  or ``error reason``;
* EOF on the socket: the template exits 0.

The template reads no ids. An SDK template also keeps the database sessions
its workers give back when they end, and lends each to the next worker it
forks (``lending.py``), and so does a program that calls ``fork_point()``
and connects with ``pepsi_dispatch.worker.connect``.

A stage that has no template yet offers one to an exec'd worker
(``PEPSI_TEMPLATE_OFFER_FD``, the same kind of socket): the worker, with its
modules imported and before it connects, forks the template from itself
(:func:`accept_offer`) instead of the dispatcher starting a second
interpreter. That template leaves the worker's pipes and slot, leads its own
session, waits until it is re-parented to the dispatcher, asks to die with
it, and greets with ``ready PID``; then it serves as above.
"""

from __future__ import annotations

import ctypes
import gc
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from pepsi_dispatch.contract import INHAND_ENV, TEMPLATE_ENV, TEMPLATE_OFFER_ENV

from .inhand import announce_template

__all__ = ["Template", "accept_offer", "from_environment", "serve_if_asked", "serve_or_announce"]

#: How long a forked worker waits to be re-parented to the dispatcher (seconds).
REPARENT_TIMEOUT = 5.0
_PR_SET_PDEATHSIG = 1
_PID = struct.Struct("=q")
#: libc's prctl(2), looked up once in the template: a forked worker that looked
#: it up itself would pay some 80 copy-on-write faults for it.
_prctl: Any = None


def _libc_prctl() -> Any:
    global _prctl
    if _prctl is None:
        _prctl = ctypes.CDLL(None, use_errno=True).prctl
    return _prctl


class SessionLender(Protocol):
    """What the template asks of the lender of database sessions
    (:class:`~.lending.Lender`; this module itself never connects)."""

    def fileno(self) -> int: ...
    def deadline(self) -> float | None: ...
    def collect(self, now: float, between_requests: bool = False) -> None: ...
    def take(self, now: float) -> Any: ...
    def lent_to(self, loan: Any, pid: int | None) -> None: ...
    def not_lent(self, loan: Any, now: float) -> None: ...
    def forget(self, loan: Any) -> None: ...
    def in_worker(self, loan: Any) -> None: ...
    def close(self) -> None: ...


class Template:
    """Serves spawn requests on the dispatcher's socket."""

    def __init__(
        self,
        sock: socket.socket,
        dispatcher_pid: int,
        greeting: bytes = b"ready",
        lender: SessionLender | None = None,
    ) -> None:
        self.sock = sock
        self.dispatcher_pid = dispatcher_pid
        #: what it says first: ``ready``, or ``ready PID`` when a worker forked it
        self.greeting = greeting
        #: lends database sessions to the forked workers (None: they connect)
        self.lender = lender

    def serve(self) -> int | None:
        """Fork workers until EOF: the template's exit status, or None in a
        forked worker (which then starts as a worker does)."""
        self.sock.send(self.greeting)
        try:
            return self._serve()
        finally:
            if self.lender is not None and self.sock.fileno() != -1:
                self.lender.close()  # the template ends (not in a forked worker)

    def _request_waiting(self) -> bool:
        """Wait for the dispatcher's next request, meanwhile taking back the
        sessions workers return; True once a request (or EOF) is there."""
        if self.lender is None:
            return True
        deadline = self.lender.deadline()
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            readable, _, _ = select.select([self.sock, self.lender], [], [], timeout)
        except InterruptedError:
            readable = []
        waiting = self.sock in readable
        self.lender.collect(time.monotonic(), between_requests=not waiting)
        return waiting

    def _serve(self) -> int | None:
        while True:
            if not self._request_waiting():
                continue
            try:
                msg, fds, _, _ = socket.recv_fds(self.sock, 64, 8)
            except (ConnectionResetError, BrokenPipeError):
                # The dispatcher closed its end (it is stopping, or retired the
                # template): the same as EOF. Nothing is written: this process's
                # stderr is the dispatcher's own, which may be a JSON log.
                return 0
            except OSError as exc:
                print(f"pepsi template: socket error: {exc}; exiting", file=sys.stderr)
                return 0
            if not msg:
                return 0
            if msg != b"spawn" or len(fds) != 4:
                _close_all(fds)
                self.sock.send(b"error bad request")
                continue
            try:
                pid = self._fork(fds)
            except OSError as exc:
                _close_all(fds)
                self.sock.send(f"error {exc}".encode())
                continue
            if pid is None:
                return None  # the forked worker
            self.sock.send(str(pid).encode())

    def _fork(self, fds: list[int]) -> int | None:
        """Fork the worker (through a middle process that exits at once); its pid,
        or None in the worker itself. A lent session goes with it."""
        now = time.monotonic()
        loan = self.lender.take(now) if self.lender is not None else None
        r, w = os.pipe()
        try:
            middle = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            self._unlent(loan, now)
            raise
        if middle == 0:
            try:
                os.close(r)
                if os.fork() != 0:
                    os._exit(0)
                os.setsid()
                os.write(w, _PID.pack(os.getpid()))
                os.close(w)
                self._become_worker(fds, loan)
            except BaseException:
                os._exit(1)
            return None
        if loan is not None and self.lender is not None:
            self.lender.lent_to(loan, None)  # first of all: the socket is the worker's
        os.close(w)
        _close_all(fds)
        try:
            os.waitpid(middle, 0)
            data = os.read(r, _PID.size)
        finally:
            os.close(r)
        if len(data) != _PID.size:
            if loan is not None and self.lender is not None:
                self.lender.forget(loan)
            raise OSError("the forked worker died at once")
        pid = _PID.unpack(data)[0]
        if loan is not None and self.lender is not None:
            self.lender.lent_to(loan, pid)
        return pid

    def _unlent(self, loan: Any, now: float) -> None:
        if loan is not None and self.lender is not None:
            self.lender.not_lent(loan, now)

    def _become_worker(self, fds: list[int], loan: Any = None) -> None:
        """In the worker: wait for the dispatcher as parent, die with it, take the
        fds (and the lent session)."""
        if not _adopted_by(self.dispatcher_pid):
            os._exit(1)  # the dispatcher died before the request was settled
        stdin, stdout, stderr, slot = fds
        for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
            os.dup2(fd, target)
            os.close(fd)
        self.sock.close()
        if self.lender is not None:
            self.lender.in_worker(loan)
        os.environ[INHAND_ENV] = str(slot)


def _adopted_by(dispatcher_pid: int) -> bool:
    """Wait (up to REPARENT_TIMEOUT) until the dispatcher is our parent, then ask
    the kernel to SIGKILL us when it dies. False if it never became our parent,
    or died meanwhile."""
    deadline = time.monotonic() + REPARENT_TIMEOUT
    while os.getppid() != dispatcher_pid:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0002)
    _libc_prctl()(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    return os.getppid() == dispatcher_pid


def _leave_the_workers_fds() -> None:
    """In a template forked from a worker: let go of the worker's pipes and
    in-hand slot, so that the dispatcher sees them close when the worker exits."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    slot = os.environ.pop(INHAND_ENV, "")
    if slot.isdigit():
        _close_all([int(slot)])


def accept_offer() -> Template | None:
    """The template offered through ``PEPSI_TEMPLATE_OFFER_FD``, forked from this
    worker: the :class:`Template` in the forked template process, None in the
    worker (and None when nothing is offered or the fork fails).

    Called once the program's modules are imported, before it connects or
    reads stdin: the template is this process as it is now, which is what the
    dispatcher would otherwise get from a second interpreter's start.
    """
    sock = _socket_from(TEMPLATE_OFFER_ENV)
    if sock is None:
        return None
    dispatcher_pid = os.getppid()
    try:
        middle = os.fork()
    except OSError:
        sock.close()
        return None
    if middle == 0:
        try:
            if os.fork() != 0:
                os._exit(0)
            os.setsid()
            _leave_the_workers_fds()
            if not _adopted_by(dispatcher_pid):
                os._exit(1)
            return Template(sock, dispatcher_pid, f"ready {os.getpid()}".encode())
        except BaseException:
            os._exit(1)
    sock.close()
    try:
        os.waitpid(middle, 0)
    except ChildProcessError:
        pass
    return None


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def from_environment() -> Template | None:
    """The template the dispatcher asks for through ``PEPSI_TEMPLATE_FD``, or None
    (the variable is removed either way, so that workers do not see it)."""
    sock = _socket_from(TEMPLATE_ENV)
    return None if sock is None else Template(sock, os.getppid())


def _socket_from(variable: str) -> socket.socket | None:
    """The socket whose descriptor the environment ``variable`` names (removed
    either way, so that workers do not see it), or None."""
    text = os.environ.pop(variable, "")
    if not text:
        return None
    try:
        return socket.socket(fileno=int(text))
    except (ValueError, OSError):
        return None


def serve_if_asked(lender: Callable[[], SessionLender | None] | None = None) -> int | None:
    """If the dispatcher started this process as its stage's template, serve
    spawn requests: the template's exit status once it ends, or None in each
    worker it forks. In a worker offered a template, fork it first (the
    template serves from here on; the worker gets None). None at once in a
    worker started as usual. ``lender`` makes, in the template only, what
    lends database sessions to its workers."""
    template = from_environment() or accept_offer()
    if template is None:
        return None
    if lender is not None:
        template.lender = lender()
    _libc_prctl()
    # Everything imported so far lives as long as the worker: out of the
    # collector's sight, a forked worker's collections never write to (and so
    # never copy) the pages it shares with the template.
    gc.freeze()
    return template.serve()


def serve_or_announce(lender: Callable[[], SessionLender | None] | None = None) -> None:
    """What ``pepsi_dispatch.worker.fork_point()`` does (documented there,
    sdk/entry.py): serve as the template, never returning, if started as one;
    in a worker, say in the slot that the program can be a template."""
    status = serve_if_asked(lender)
    if status is not None:
        sys.exit(status)
    announce_template()
