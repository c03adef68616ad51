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

The template holds no database connection and reads no ids.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import socket
import struct
import sys
import time

from pepsi_dispatch.contract import INHAND_ENV, TEMPLATE_ENV

from .inhand import announce_template

__all__ = ["Template", "fork_point", "from_environment", "serve_if_asked"]

#: How long a forked worker waits to be re-parented to the dispatcher (seconds).
REPARENT_TIMEOUT = 5.0
_PR_SET_PDEATHSIG = 1
_PID = struct.Struct("=q")


class Template:
    """Serves spawn requests on the dispatcher's socket."""

    def __init__(self, sock: socket.socket, dispatcher_pid: int) -> None:
        self.sock = sock
        self.dispatcher_pid = dispatcher_pid

    def serve(self) -> int | None:
        """Fork workers until EOF: the template's exit status, or None in a
        forked worker (which then starts as a worker does)."""
        self.sock.send(b"ready")
        while True:
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
        or None in the worker itself."""
        r, w = os.pipe()
        middle = os.fork()
        if middle == 0:
            try:
                os.close(r)
                if os.fork() != 0:
                    os._exit(0)
                os.setsid()
                os.write(w, _PID.pack(os.getpid()))
                os.close(w)
                self._become_worker(fds)
            except BaseException:
                os._exit(1)
            return None
        os.close(w)
        _close_all(fds)
        try:
            os.waitpid(middle, 0)
            data = os.read(r, _PID.size)
        finally:
            os.close(r)
        if len(data) != _PID.size:
            raise OSError("the forked worker died at once")
        return _PID.unpack(data)[0]

    def _become_worker(self, fds: list[int]) -> None:
        """In the worker: wait for the dispatcher as parent, die with it, take the fds."""
        deadline = time.monotonic() + REPARENT_TIMEOUT
        while os.getppid() != self.dispatcher_pid:
            if time.monotonic() > deadline:
                os._exit(1)
            time.sleep(0.0002)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != self.dispatcher_pid:
            os._exit(1)  # the dispatcher died before the request was settled
        stdin, stdout, stderr, slot = fds
        for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
            os.dup2(fd, target)
            os.close(fd)
        self.sock.close()
        os.environ[INHAND_ENV] = str(slot)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def from_environment() -> Template | None:
    """The template the dispatcher asks for through ``PEPSI_TEMPLATE_FD``, or None
    (the variable is removed either way, so that workers do not see it)."""
    text = os.environ.pop(TEMPLATE_ENV, "")
    if not text:
        return None
    try:
        sock = socket.socket(fileno=int(text))
    except (ValueError, OSError):
        return None
    return Template(sock, os.getppid())


def serve_if_asked() -> int | None:
    """If the dispatcher started this process as its stage's template, serve
    spawn requests: the template's exit status once it ends, or None in each
    worker it forks. None at once in a worker started as usual."""
    template = from_environment()
    if template is None:
        return None
    # Everything imported so far lives as long as the worker: out of the
    # collector's sight, a forked worker's collections never write to (and so
    # never copy) the pages it shares with the template.
    gc.freeze()
    return template.serve()


def fork_point() -> None:
    """For programs that speak the pipe protocol themselves: call it once the
    program's modules are imported, before it connects or reads stdin.

    In a worker it returns at once, having said (in the in-hand slot's
    capability word) that the program can be its stage's template. The
    dispatcher then starts the program once more as the template: there the
    call never returns -- it forks each new worker of the stage, and each
    forked worker returns from it and goes on as a worker started by exec
    would -- and the template process exits when the dispatcher closes it.
    """
    status = serve_if_asked()
    if status is not None:
        sys.exit(status)
    announce_template()
