"""Starting worker children: in their own session, dying with the dispatcher.

A worker is a child of the dispatcher whichever way it starts: ``PROGRAM
[-c FILE] worker`` exec'd by :func:`start_child`, or forked by its stage's
template process (templates.py), which hands it to us through a middle
process that exits at once: we are a child subreaper, so it is re-parented
to us. Either way it leads its own session and the kernel SIGKILLs it when
the dispatcher dies.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import shlex
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping
from typing import IO, Protocol

from pepsi_dispatch.contract import INHAND_ENV, TEMPLATE_OFFER_ENV
from pepsi_dispatch.coordinator.workers.inhand import InHandSlot

log = logging.getLogger(__name__)

#: stderr pipe capacity asked for (see WorkerProcess.__init__).
STDERR_PIPE_SIZE = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not on Linux
    _libc = None


def _child_setup(parent: int) -> None:
    """Runs in the child between fork and exec: die with the dispatcher.

    ``PR_SET_PDEATHSIG`` makes the kernel SIGKILL the worker when the
    dispatcher dies, even by SIGKILL. If the parent is already gone by the
    time this runs (a race the man page warns about), exit at once.
    """
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
    # The dispatcher ignores nothing, but be explicit: a worker starts with
    # default dispositions and an empty signal mask whatever we did.
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def become_subreaper() -> bool:
    """Make this process a child subreaper (``PR_SET_CHILD_SUBREAPER``).

    Grandchildren whose parent (a worker) dies are then re-parented to the
    dispatcher instead of to init, so they are ours to reap (see
    :func:`reap_orphans`) -- and zombies cannot pile up when the dispatcher runs
    as PID 1 in a container. False if the kernel refused (not Linux).
    """
    if _libc is None or _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log.debug("cannot become a child subreaper; escaped grandchildren go to init")
        return False
    return True


def is_subreaper() -> bool:
    """Is this process a child subreaper (so that a worker forked by a template
    is re-parented to it)?"""
    if _libc is None:
        return False
    flag = ctypes.c_int(0)
    if _libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) != 0:
        return False
    return bool(flag.value)


class Child(Protocol):
    """What a :class:`WorkerProcess` needs of its child: a :class:`subprocess.Popen`,
    or a worker a template forked (templates.py)."""

    pid: int
    returncode: int | None
    stdin: IO[bytes] | None
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


#: Forks a worker through a stage's template, given its in-hand slot (templates.py).
Fork = Callable[[InHandSlot], Child]


def worker_argv(program: str, config_file: str | None) -> list[str]:
    """``PROGRAM [-c FILE] worker``; FileNotFoundError for an empty PROGRAM."""
    argv = shlex.split(program)
    if not argv:
        raise FileNotFoundError(errno.ENOENT, "empty PROGRAM", program)
    if config_file:
        argv += ["-c", config_file]
    argv.append("worker")
    return argv


def start_child(
    argv: list[str], env: Mapping[str, str], pass_fds: tuple[int, ...] = (), pipes: bool = True
) -> subprocess.Popen[bytes]:
    """Start a worker (or a template: no pipes) in its own session; it dies with us."""
    parent = os.getpid()
    pipe = subprocess.PIPE if pipes else subprocess.DEVNULL
    return subprocess.Popen(
        argv,
        stdin=pipe,
        stdout=pipe,
        stderr=subprocess.PIPE if pipes else None,
        env=dict(env),
        close_fds=True,
        pass_fds=pass_fds,
        start_new_session=True,
        preexec_fn=lambda: _child_setup(parent),
        bufsize=0,
    )


def start_worker(
    argv: list[str], env: Mapping[str, str], slot: InHandSlot, offer: socket.socket | None = None
) -> Child:
    """Start a worker in its own session with non-blocking pipes, offered ``slot``
    (and, with ``offer``, the stage's template to fork: templates.py; our copy
    of that socket end is closed here)."""
    assert slot.fd is not None
    env = {**env, INHAND_ENV: str(slot.fd)}
    fds: tuple[int, ...] = (slot.fd,)
    if offer is not None:
        env[TEMPLATE_OFFER_ENV] = str(offer.fileno())
        fds += (offer.fileno(),)
    try:
        proc = start_child(argv, env, fds)
    finally:
        if offer is not None:
            offer.close()
    own_ends(proc)
    return proc


def own_ends(proc: Child) -> None:
    """Make our pipe ends non-blocking, and stderr's pipe large."""
    assert proc.stdin and proc.stdout and proc.stderr
    for f in (proc.stdin, proc.stdout, proc.stderr):
        os.set_blocking(f.fileno(), False)
    # stderr is drained whenever the loop is not inside a database call;
    # a 1 MiB pipe (Linux default 64 KiB) lets a flood continue through
    # such a call without the worker ever blocking on a write.
    try:
        fcntl.fcntl(proc.stderr.fileno(), _F_SETPIPE_SZ, STDERR_PIPE_SIZE)
    except OSError:
        pass  # above /proc/sys/fs/pipe-max-size: keep the default


__all__ = [
    "Child",
    "Fork",
    "become_subreaper",
    "is_subreaper",
    "own_ends",
    "start_child",
    "start_worker",
    "worker_argv",
]
