"""The group sentinel: kills the workers' process groups if the dispatcher dies.

Each worker leads its own process group, and the contract is that the whole group
is killed before any id of a dead worker is released. While the dispatcher lives it
does that itself (workers/process.py kills the group before reaping the
leader). When the dispatcher is killed -9, ``PR_SET_PDEATHSIG`` ends the workers,
but not their children: a grandchild still in a worker's group would be re-parented
to init and go on working on an id that the next dispatcher's start-up releases
and hands out again.

So :func:`guard_process_tree` forks, before any database connection or worker
exists, a small child -- ``pepsi-sentinel`` in ``ps -o comm`` -- in a session of
its own, with SIGINT, SIGTERM, SIGHUP and SIGTSTP ignored and every inherited file
descriptor closed except stderr. It reads a pipe whose write end only the
dispatcher holds (non-inheritable; workers never see it): ``+PGID`` when a worker
is spawned, ``-PGID`` once that worker's group has been killed and before its
leader is reaped (so the group id cannot have been reused). At EOF -- the
dispatcher exited or died, by whatever means -- it SIGKILLs every group still
recorded and exits; after a clean shutdown none is left, so nothing is killed.

The dispatcher never waits for the sentinel: its writes are non-blocking and
buffered, and a sentinel that is gone (EPIPE, or reaped as an unknown child)
is a WARNING once; the dispatcher carries on without it.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import signal
import time

from pepsi_dispatch.coordinator.workers.children import become_subreaper

log = logging.getLogger(__name__)

#: Its name in ``ps -o comm`` / ``top`` (the command line stays the dispatcher's).
NAME = b"pepsi-sentinel"
#: Signals it ignores: a Ctrl-C or hangup meant for the dispatcher must not end it.
IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGTSTP)
#: Bytes the dispatcher buffers while the pipe is full before it gives up on it.
MAX_BUFFERED = 1 << 20
#: How long close() waits for the sentinel to exit (it exits at once at EOF).
CLOSE_WAIT = 2.0
_PR_SET_NAME = 15
try:
    # Loaded now: no dlopen() between fork and the sentinel's loop.
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not on Linux
    _libc = None


def guard_process_tree() -> GroupSentinel:
    """Become a child subreaper and start the group sentinel (call before any
    database connection or worker exists)."""
    become_subreaper()  # orphaned grandchildren of workers come to us, to be reaped
    return GroupSentinel.start()


class GroupSentinel:
    """The dispatcher's end of the sentinel: ``+PGID`` / ``-PGID`` lines on a pipe.

    A ``GroupSentinel()`` that was never started (tests that drive the
    supervisor without the loop, or a fork that failed) does nothing.
    """

    def __init__(self, pid: int = 0, fd: int = -1) -> None:
        #: the sentinel's pid (0: none, or it is gone).
        self.pid = pid
        self._fd = fd
        self._buf = b""

    @classmethod
    def start(cls) -> GroupSentinel:
        """Fork the sentinel; a GroupSentinel that does nothing if that fails."""
        try:
            r, w = os.pipe()  # both ends close-on-exec: no worker inherits them
        except OSError as exc:
            log.warning("cannot start the group sentinel: %s", exc)
            return cls()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(r)
            os.close(w)
            log.warning("cannot start the group sentinel: %s", exc)
            return cls()
        if pid == 0:  # pragma: no cover - the child; it never returns
            code = 1
            try:
                os.close(w)
                code = _sentinel_main(r)
            finally:
                os._exit(code)
        os.close(r)
        os.set_blocking(w, False)
        log.debug("group sentinel pid %d started", pid)
        return cls(pid, w)

    @property
    def running(self) -> bool:
        return self._fd >= 0

    def watch(self, pgid: int) -> None:
        """A worker leading process group ``pgid`` was spawned."""
        self._send(b"+%d\n" % pgid)

    def forget(self, pgid: int) -> None:
        """The group ``pgid`` was killed; its leader is about to be reaped."""
        self._send(b"-%d\n" % pgid)

    def _send(self, line: bytes) -> None:
        if self._fd < 0:
            return
        self._buf += line
        try:
            while self._buf:
                n = os.write(self._fd, self._buf)
                self._buf = self._buf[n:]
        except BlockingIOError:
            # The sentinel is not reading (stopped?): keep the lines for the next
            # write, so a "-" is never lost; give up on a sentinel that is stuck.
            if len(self._buf) > MAX_BUFFERED:
                self._lost("is not reading its pipe")
        except OSError as exc:  # EPIPE: it is gone
            self._lost(f"is gone ({exc.strerror})")

    def reaped(self, pid: int) -> bool:
        """``pid``, an unknown child the dispatcher reaped: was it the sentinel?"""
        if not pid or pid != self.pid:
            return False
        self.pid = 0
        self._lost("exited")
        return True

    def _lost(self, why: str) -> None:
        if self._fd >= 0:
            log.warning(
                "group sentinel %s: if the dispatcher is killed now, children its workers"
                " leave behind are not killed with them",
                why,
            )
            os.close(self._fd)
            self._fd = -1
        self._buf = b""

    def close(self) -> None:
        """The dispatcher is done: EOF to the sentinel, which exits; reap it."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        pid, self.pid = self.pid, 0
        deadline = time.monotonic() + CLOSE_WAIT
        while pid:
            try:
                done, _status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return
            if done or time.monotonic() > deadline:
                return  # not gone yet: whoever inherits it reaps it
            time.sleep(0.005)


def _sentinel_main(fd: int) -> int:
    """The sentinel process: read ``+PGID``/``-PGID`` lines until EOF, then SIGKILL
    every group still recorded. Returns its exit status."""
    os.setsid()  # out of the dispatcher's group and session: ^C, kill -PGID miss it
    for sig in IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:
        pass
    if _libc is not None:
        _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(NAME), 0, 0, 0)
    if fd < 3:  # started with stdin/stdout closed: keep the pipe clear of 0-2
        fd = fcntl.fcntl(fd, fcntl.F_DUPFD, 3)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.closerange(3, fd)
    os.closerange(fd + 1, os.sysconf("SC_OPEN_MAX"))
    for pgid in sorted(read_groups(fd)):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            continue
        _say(b"pepsi-sentinel: dispatcher gone; killed process group %d of a worker\n" % pgid)
    return 0


def read_groups(fd: int) -> set[int]:
    """Apply ``+PGID`` / ``-PGID`` lines read from ``fd`` until EOF; the groups left."""
    groups: set[int] = set()
    partial = b""
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:
            data = b""
        if not data:
            return groups
        lines = (partial + data).split(b"\n")
        partial = lines.pop()
        for line in lines:
            sign, digits = line[:1], line[1:]
            if not digits.isdigit() or int(digits) <= 1:
                continue
            if sign == b"+":
                groups.add(int(digits))
            elif sign == b"-":
                groups.discard(int(digits))


def _say(message: bytes) -> None:
    try:
        os.write(2, message)
    except OSError:
        pass


__all__ = ["GroupSentinel", "guard_process_tree", "read_groups"]
