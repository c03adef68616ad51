"""One worker process: spawn, pipes, in-flight bookkeeping, kill and reap.

A :class:`WorkerProcess` is the dispatcher's view of one ``PROGRAM [-c FILE] worker``
child. It owns three non-blocking pipe ends and the ordered list of ids
written to the child and not answered yet. It never decides anything about
rows; the loop does that with what :meth:`WorkerProcess.read_answers` and
:meth:`WorkerProcess.poll` report.
"""

from __future__ import annotations

import enum
import fcntl
import logging
import os
import signal
import socket
import struct
import termios
import time
from collections import deque
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass

from pepsi_dispatch.contract import EX_TEMPFAIL, EXIT_NO_STAGE, MAX_LINE
from pepsi_dispatch.coordinator.workers.children import (
    Child,
    Fork,
    own_ends,
    start_worker,
    worker_argv,
)
from pepsi_dispatch.coordinator.workers.inhand import InHandSlot
from pepsi_dispatch.coordinator.workers.lastwords import LastWords

log = logging.getLogger(__name__)

#: Chunk size of pipe reads: a busy worker's answers ("0\n", 2 bytes each)
#: are read thousands at a time.
READ_CHUNK = 65536
#: An answer line longer than this is cut to its first MAX_LINE bytes (one
#: answer); the rest of it is discarded up to its newline.
MAX_ANSWER_LINE = 65536
#: stderr lines longer than this are cut before they reach the log.
MAX_STDERR_LINE = 8192


def reap_orphans(workers: Container[int]) -> tuple[list[int], bool]:
    """Reap every exited child that is not one of ``workers``.

    Returns the pids reaped, and whether the scan stopped at an exited worker.
    Each exited child is looked at first without reaping it (``WNOWAIT``): a
    worker must be reaped by its :class:`WorkerProcess` (which kills its process group
    first), so the scan stops there; the caller polls its workers and calls
    again.
    """
    reaped: list[int] = []
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped, False
        if info is None or not info.si_pid:
            return reaped, False
        if info.si_pid in workers:
            return reaped, True
        try:
            os.waitpid(info.si_pid, os.WNOHANG)
        except ChildProcessError:
            pass
        reaped.append(info.si_pid)


class ExitKind(enum.Enum):
    """How the loop settles the ids of a worker that is gone (see :func:`classify_exit`)."""

    #: We SIGKILLed it at MAX_RUNTIME (:class:`Overdue`): the message in hand
    #: times out (the one its in-hand slot names, else the overdue head of
    #: line), the rest go back to pending.
    TIMEOUT = "timeout"
    #: We SIGKILLed it (protocol error, watchdog): whatever it still holds
    #: never got an answer and goes back to pending.
    KILLED = "killed"
    #: Stopped on purpose (EOF, SIGTERM at shutdown), or it held nothing:
    #: anything still held goes back to pending.
    STOPPED = "stopped"
    #: It exited on its own while holding nothing (an unexpected exit).
    EXITED = "exited"
    #: It died before reading any input: nothing started; release, cool down.
    DIED_BEFORE_READING = "died before reading"
    #: Exit 75: "I could not reach the database; nothing I held is done".
    TEMPFAIL = "tempfail"
    #: Exit 78 (EXIT_NO_STAGE): its stage is not in its configuration; it
    #: touched nothing. Release all, log at ERROR, cool the stage down.
    NO_STAGE = "no stage"
    #: It exited while the dispatcher had no database connection: release all.
    DB_DOWN = "database down"
    #: A crash: the head-of-line message fails, the rest go back to pending.
    CRASH = "crash"


def classify_exit(
    returncode: int,
    *,
    killed: bool,
    stopping: bool,
    shutting_down: bool,
    unanswered: int,
    undelivered: int,
    started: bool,
    db_connected: bool,
    timed_out: bool = False,
) -> ExitKind:
    """Decide what a worker's end means for the ids it held (a pure function).

    ``unanswered``: ids written to it and not answered; ``undelivered``: ids
    whose write failed (they never reached it); ``started``: it read some of
    its input; ``db_connected``: the dispatcher's own database connection is up;
    ``timed_out``: we killed it at MAX_RUNTIME.
    """
    if timed_out:
        return ExitKind.TIMEOUT
    if killed:
        return ExitKind.KILLED
    if shutting_down:
        return ExitKind.STOPPED
    if returncode == EX_TEMPFAIL:
        return ExitKind.TEMPFAIL
    if returncode == EXIT_NO_STAGE:
        return ExitKind.NO_STAGE
    if (unanswered or undelivered) and not started:
        return ExitKind.DIED_BEFORE_READING
    if not unanswered:
        return ExitKind.STOPPED if stopping else ExitKind.EXITED
    if not db_connected:
        return ExitKind.DB_DOWN
    return ExitKind.CRASH


def describe_exit(returncode: int) -> str:
    """``worker exited with code 3`` / ``worker killed by signal SIGSEGV``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return f"worker killed by signal {name}"
    return f"worker exited with code {returncode}"


@dataclass(frozen=True, slots=True)
class Overdue:
    """Why a worker was killed at MAX_RUNTIME: its head-of-line message ``head``
    was unanswered ``seconds`` after it reached the head. Who times out is
    decided once the worker is reaped (exits.py), from its in-hand slot."""

    head: int
    seconds: float
    #: the dispatch_error of the message that times out
    reason: str


class Life(enum.Enum):
    """A worker's life. It only moves forward, and only through WorkerProcess's methods
    (drawn in docs/INTERNALS.md, "A worker's life").

    ``retire()`` (a reload) is a mark on RUNNING or STOPPING, not a state of its
    own: a retiring worker takes no new ids and is stopped once drained.
    """

    #: takes ids (unless retired).
    RUNNING = 1
    #: asked to go: stdin closed (idle, MAX_MESSAGES, reload) or SIGTERM (shutdown).
    STOPPING = 2
    #: SIGKILLed (watchdog, protocol error, shutdown deadline).
    KILLED = 3


def _start(
    argv: list[str],
    env: Mapping[str, str],
    slot: InHandSlot,
    fork: Fork | None,
    offer: socket.socket | None,
) -> Child:
    """Exec ``argv`` (offered the template's socket ``offer``, if any), or fork
    through a template, offering ``slot``; the slot is closed if the start fails."""
    try:
        if fork is not None:
            proc = fork(slot)
            own_ends(proc)
        else:
            proc = start_worker(argv, env, slot, offer)
    except BaseException:
        slot.close()
        raise
    slot.handed_over()
    return proc


class WorkerProcess:
    """One running worker child of a stage."""

    def __init__(
        self,
        stage: str,
        program: str,
        config_file: str | None,
        env: Mapping[str, str],
        generation: int,
        fork: Fork | None = None,
        offer: socket.socket | None = None,
    ) -> None:
        """Start the child (forked by a template: ``fork``; exec'd, maybe
        ``offer``ed the template to fork). OSError if it cannot start."""
        #: where the worker names the message whose handler runs (inhand.py)
        self.slot = InHandSlot()
        self.proc: Child = _start(worker_argv(program, config_file), env, self.slot, fork, offer)
        self.pid: int = self.proc.pid
        #: forked by the stage's template (templates.py), not exec'd
        self.forked = fork is not None
        self.stage = stage
        self.generation = generation
        #: called with its pid once its group is killed, before the reap (sentinel.py).
        self.group_killed: Callable[[int], None] = lambda pgid: None
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr
        self.stdin_fd: int | None = self.proc.stdin.fileno()
        self.stdout_fd: int | None = self.proc.stdout.fileno()
        self.stderr_fd: int | None = self.proc.stderr.fileno()
        #: ids written (or queued to write) and not answered, in order.
        self.inflight: deque[int] = deque()
        #: ids whose write failed with EPIPE (never reached the worker).
        self.undelivered: list[int] = []
        #: bytes written to stdin in its life; whether it has read any of them yet;
        #: when it was first given ids (the start-up watchdog counts from there).
        self.written, self.reading, self.first_given = 0, False, 0.0
        #: bytes not yet accepted by the stdin pipe (normally empty).
        self.outbuf = b""
        #: monotonic time the head-of-line id reached the head.
        self.head_since = 0.0
        #: ids handed to this worker in its life (for MAX_MESSAGES).
        self.sent = 0
        #: answers received in its life (a crash before any answer → cooldown).
        self.answers_received = 0
        #: where it is in its life (:class:`Life`); only retire/stop/terminate/kill change it.
        self.life = Life.RUNNING
        self._retired = False
        #: when a stopping worker is killed if still there (0 = the shutdown deadline).
        self.stop_deadline = 0.0
        #: why we asked it to go (idle, MAX_MESSAGES, reload) -- for the exit log line.
        self.stop_reason = ""
        self.overdue: Overdue | None = None  # killed at MAX_RUNTIME: why (watchdogs.py)
        #: stdout reached EOF (the child is exiting or closed it); see saw_eof().
        self.eof, self.eof_at = False, 0.0
        #: the stderr lines that may say why it died: a held-off cause quotes them.
        self.last_words = LastWords()
        #: monotonic time it last had nothing in flight (idle reap).
        self.idle_since = time.monotonic()
        self._out_partial = b""
        self._err_partial = b""
        self._err_skipping = False
        #: inside an over-long stdout line whose head was already reported.
        self._out_skipping = False

    # -- life -----------------------------------------------------------------
    @property
    def retiring(self) -> bool:
        """No new ids; stopped once drained (a reload retired it)."""
        return self._retired

    @property
    def stopping(self) -> bool:
        """We asked it to go (stdin closed, SIGTERM or SIGKILL sent)."""
        return self.life is not Life.RUNNING

    @property
    def killed(self) -> bool:
        """SIGKILL was sent."""
        return self.life is Life.KILLED

    def retire(self) -> bool:
        """Mark it retiring (a reload); False if it was already."""
        if self._retired:
            return False
        self._retired = True
        return True

    def stop(self, deadline: float, why: str) -> None:
        """Ask it to go: EOF on stdin (it finishes and exits 0), killed after ``deadline``."""
        assert self.life is Life.RUNNING, f"stop() of a worker that is {self.life.name}"
        self.life = Life.STOPPING
        self.stop_deadline = deadline
        self.stop_reason = why
        self.close_stdin()

    def terminate(self) -> None:
        """SIGTERM to its group (the dispatcher is stopping); a killed worker stays killed."""
        if self.life is Life.RUNNING:
            self.life = Life.STOPPING
        self.signal(signal.SIGTERM)

    def saw_eof(self, now: float) -> None:
        """Its stdout reached EOF: it is exiting (or closed it)."""
        self.eof = True
        self.eof_at = now
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.stdout_fd = None

    # -- ids ------------------------------------------------------------------
    def give(self, ids: list[int], now: float, lines: Mapping[int, str] | None = None) -> None:
        """Append ``ids`` to the pipeline: one write of ``"id\\n"`` lines, or of
        the row lines of ``lines`` for the ids that have one (a worker that
        takes rows on its pipe: see ``CAN_TAKE_ROWS``)."""
        if not self.inflight:
            self.head_since = now
        if not self.first_given:
            self.first_given = now
        self.inflight.extend(ids)
        self.sent += len(ids)
        if lines:
            text = "\n".join([lines.get(i) or str(i) for i in ids])
        else:
            text = "\n".join(map(str, ids))
        data = (text + "\n").encode()
        if self.outbuf:
            self.outbuf += data
        else:
            self.outbuf = data
            self.flush_stdin()

    def flush_stdin(self) -> bool:
        """Write what is buffered; True when the buffer is empty afterwards.

        A worker that has died shows up as EPIPE here. The ids that never
        reached it (the tail of ``inflight``, one per unwritten line) move to
        :attr:`undelivered`: they cannot have started, so when the worker is
        reaped they go back to pending instead of failing as its head of line.
        """
        if self.stdin_fd is None:
            self.outbuf = b""
            return True
        while self.outbuf:
            try:
                n = os.write(self.stdin_fd, self.outbuf)
            except BlockingIOError:
                return False
            except OSError:  # EPIPE: the reader is gone
                lost = min(len(self.inflight), self.outbuf.count(b"\n"))
                for _ in range(lost):
                    self.undelivered.append(self.inflight.pop())
                self.outbuf = b""
                return True
            self.written += n
            self.outbuf = self.outbuf[n:]
        return True

    def has_read(self) -> bool:
        """Has the worker read anything from stdin yet (is it up and running)?

        A fresh worker spends its start-up (interpreter, imports, connect:
        0.3-1 s for a Python worker on a loaded 2-core box) before reading its
        first id; that time must not count against the first message's
        MAX_RUNTIME. FIONREAD on the pipe's write end tells how many written
        bytes are still unread.
        """
        if self.reading:
            return True
        if self.stdin_fd is None or not self.written:
            return False
        try:
            unread = struct.unpack("i", fcntl.ioctl(self.stdin_fd, termios.FIONREAD, b"\0" * 4))[0]
        except OSError:
            return False
        if unread < self.written:
            self.reading = True
        return self.reading

    # -- reading ----------------------------------------------------------------
    def read_answers(self) -> list[bytes] | None:
        """Complete answer lines available on stdout; None at EOF."""
        assert self.stdout_fd is not None
        chunks = []
        # At most 1 MiB per call: a worker flooding stdout must not hold the loop.
        for _ in range(16):
            try:
                data = os.read(self.stdout_fd, READ_CHUNK)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                if chunks:
                    break  # report the lines first; EOF shows up on the next read
                if self._out_partial:
                    # A last answer without its newline still counts.
                    line, self._out_partial = self._out_partial, b""
                    return [line]
                return None
            chunks.append(data)
            if len(data) < READ_CHUNK:
                break
        buf = self._out_partial + b"".join(chunks)
        lines = buf.split(b"\n")
        partial = lines.pop()
        if self._out_skipping:
            if lines:
                # The tail of an over-long line, up to its newline: its head already
                # went out as the answer, so the tail is no answer of its own.
                del lines[0]
                self._out_skipping = False
            else:
                partial = b""  # still inside it
        if len(partial) > MAX_ANSWER_LINE:
            # A line this long (or one that never ends) is kept only by its head: that
            # is one answer, classified as if the whole line had been read in one go
            # (parse_answer looks at the first MAX_LINE bytes only); the rest of the
            # line, whenever it comes, is dropped.
            lines.append(partial[:MAX_LINE])
            self._out_skipping = True
            partial = b""
        self._out_partial = partial
        return lines

    def read_stderr(self) -> list[str] | None:
        """Complete stderr lines (cut to 8 KiB); None at EOF.

        Reads at most a few chunks per call so a flood of megabytes cannot
        starve the rest of the loop; the fd stays readable and is served again
        on the next iteration. The pipe is drained continuously, so the
        worker never blocks on a full stderr pipe.
        """
        assert self.stderr_fd is not None
        out: list[str] = []
        for _ in range(16):
            try:
                data = os.read(self.stderr_fd, READ_CHUNK)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                if self._err_partial and not self._err_skipping:
                    out.append(self._err_partial.decode("utf-8", "replace"))
                self._err_partial = b""
                self._note_stderr(out)
                return out or None
            buf = self._err_partial + data
            lines = buf.split(b"\n")
            partial = lines.pop()
            for line in lines:
                if self._err_skipping:
                    self._err_skipping = False  # tail of a cut line
                    continue
                out.append(line[:MAX_STDERR_LINE].decode("utf-8", "replace"))
            if len(partial) > MAX_STDERR_LINE:
                if not self._err_skipping:
                    out.append(partial[:MAX_STDERR_LINE].decode("utf-8", "replace") + " [cut]")
                self._err_skipping = True
                partial = b""
            self._err_partial = partial
            if len(data) < READ_CHUNK:
                break
        self._note_stderr(out)
        return out

    def _note_stderr(self, lines: list[str]) -> None:
        self.last_words.note(lines)

    # -- stopping ---------------------------------------------------------------
    def close_stdin(self) -> None:
        """EOF on stdin: the worker finishes what it has and exits 0."""
        if self.stdin_fd is not None:
            try:
                self.proc.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass
            self.stdin_fd = None
            self.outbuf = b""

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the worker's process group (ignored once it is reaped).

        The whole group: a shell wrapper's child working on a message must
        hear the stop as well. While the leader is unreaped its pid, and so
        the group id, cannot be reused.
        """
        if self.proc.returncode is None:
            try:
                os.killpg(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                try:
                    os.kill(self.pid, sig)
                except ProcessLookupError:
                    pass

    def kill(self) -> None:
        """SIGKILL the worker and everything in its session (it leads its own group)."""
        self.life = Life.KILLED
        if self.proc.returncode is None:
            # While the leader is unreaped its group id cannot be reused, so
            # killing the group is safe here and also ends grandchildren that
            # could otherwise keep working on our rows.
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.signal(signal.SIGKILL)

    def poll(self) -> int | None:
        """Exit status if the child has exited (reaped without blocking), else None.

        Before the exited leader is reaped -- while its group id is still
        reserved -- the rest of its process group is SIGKILLed: no child it
        left behind may go on working on ids the loop is about to release.
        """
        if self.proc.returncode is not None:
            return self.proc.returncode
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return self.proc.poll()
        if info is None or not info.si_pid:
            return None
        self._kill_group()
        return self.proc.poll()

    def _kill_group(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.group_killed(self.pid)

    def wait_dead(self) -> int:
        """SIGKILL and reap, blocking (a SIGKILLed child goes away in milliseconds)."""
        if self.proc.returncode is None:
            self.kill()
            self.group_killed(self.pid)
            self.proc.wait()
        return self.proc.returncode

    def close_fds(self) -> None:
        """Close every pipe end still open."""
        self.close_stdin()
        for f in (self.proc.stdout, self.proc.stderr):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        self.stdout_fd = self.stderr_fd = None

    def fds(self) -> Iterable[int]:
        """Open read fds (stdout, stderr)."""
        return [fd for fd in (self.stdout_fd, self.stderr_fd) if fd is not None]

    def __repr__(self) -> str:
        return f"<WorkerProcess {self.stage} pid {self.pid} inflight {len(self.inflight)}>"
