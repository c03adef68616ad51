"""Database sessions lent by a stage's template to the workers it forks, so that
a worker recycled at MAX_MESSAGES hands its session to its replacement
instead of the replacement starting a new PostgreSQL backend.

A new backend costs the server 4-5 ms of CPU here before the worker's first
message (the fork, the catalog caches, the first calls of the SDK's
functions), and the client another half millisecond; a session passed on
costs a reset round trip. The mechanics are those of a connection pooler
(the session is reset as ``DISCARD ALL`` would, minus the plan cache), with
the pool kept in the template process:

* The template holds a :class:`Lender`. Before it forks a worker it takes a
  connection given back by an earlier worker, if one is waiting and healthy
  (else the worker connects itself, as without a template: the template
  never connects to serve a fork request, so a burst of new workers
  connects in parallel). The forked worker inherits the connection
  (the libpq and psycopg state as they are in the template: idle, nothing
  buffered). Right after the fork the template points the socket's
  descriptor number at ``/dev/null``: it keeps the number and the objects,
  but no longer the socket, so a worker that dies in any way (SIGKILL, the
  OOM killer) closes the session's last copy and the server ends it at once,
  rolling back what was open, exactly as for a worker that connected itself.
* A worker that ends normally (EOF, or a stop signal) with its connection
  idle resets the session (:data:`RESET_SESSION`) and sends the socket back
  to the template over a socket pair (``SCM_RIGHTS``), then exits without
  closing it; its own descriptor number then points at ``/dev/null``, so
  nothing the ending process still does with the connection (a thread, an
  ``atexit`` function) reaches the session. The template puts the socket
  back under the same number:
  its copy of the connection's state is again exactly the session's (the
  worker consumed everything the server sent up to the reset's last answer).
* A worker that ends normally after it connected itself or reconnected, or
  whose connection is in a transaction, closes it as before and asks the
  template (:data:`WANT`) to open a session for the next worker, between
  requests, one per loop turn (a request that comes meanwhile waits for at
  most one connect: a few milliseconds, at most the 2 s connect timeout per
  address). So recycling converges on sessions passed on, while a burst's
  new workers still connect in parallel. Encrypted sessions (TLS or
  GSSAPI: the encryption state lives in the worker's memory) are never
  lent: the template stops lending once it sees one. Nor are connections
  through a pooler (:mod:`pepsi_dispatch.pooling`): opening one starts no
  backend, and in transaction mode the reset would run in whichever server
  session the pooler picked, not in one this worker owns.
* Why up to :data:`IDLE_MAX` sessions wait, and the oldest is lent first: a
  stage's workers reach MAX_MESSAGES close together, and the dispatcher asks
  for each replacement (and for a warm spare) a millisecond or two before
  the ending worker's session comes back. With a spare waiting when a wave
  starts, each fork takes the session the previous worker gave back. The
  spares come from the misses themselves: a fork that found none waiting
  has one opened for the next fork right after, between requests
  (``workers_connect``: at once in the SDK's template; in ``fork_point()``'s
  once a worker gave a session back or asked for one). Lending the oldest
  first keeps every waiting session in use, so none expires while the
  stage recycles.

At most :data:`IDLE_MAX` connections wait in the template, each for at most
:data:`IDLE_SECONDS`; one that the server closed meanwhile (the socket is
readable) is dropped when taken. A template that cannot connect lends
nothing for :data:`RETRY_SECONDS` (its workers connect themselves, with
their own errors and reconnects).
"""

from __future__ import annotations

import os
import select
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psycopg

from .connection import CHECK_CLIENT, OPENED_HERE, Connect, connector

if TYPE_CHECKING:
    from pepsi_dispatch.config import Config

__all__ = [
    "IDLE_MAX",
    "IDLE_SECONDS",
    "LEND_CONNECT_TIMEOUT",
    "LEND_ENV",
    "RESET_SESSION",
    "Lender",
    "Loan",
    "connect",
    "give_back",
    "lending_wanted",
    "loan_in_hand",
    "protocol_lender",
    "take_lent",
]

#: ``PEPSI_WORKER_LEND_SESSIONS=0``: the template lends no sessions (each worker connects).
LEND_ENV = "PEPSI_WORKER_LEND_SESSIONS"
#: The template waits at most this long for a new connection (seconds). A DSN's
#: own smaller ``connect_timeout`` wins.
LEND_CONNECT_TIMEOUT = 2

#: Connections at most waiting in the template for the next workers: the
#: session an ending worker gives back, and a spare for each fork that comes
#: before it (a replacement, and the warm spare of a recycling stage); fewer
#: for a stage of PARALLELISM 1 (PARALLELISM + 1).
IDLE_MAX = 3
#: How long a given-back connection waits for the next worker (seconds): longer
#: than a busy stage takes between two waves of recycles, so that its spare is
#: still there for the next.
IDLE_SECONDS = 60.0
#: After a failed connect, the template lends nothing this long (seconds).
RETRY_SECONDS = 5.0

#: What a worker runs before it gives its session back: ``DISCARD ALL`` without
#: ``DISCARD PLANS`` (the SDK's statements keep their plans across workers).
#: Whatever a handler left in the session (settings, a role, prepared
#: statements, LISTEN, advisory locks, temporary tables, cursors) is gone; the
#: client check every SDK session has (:data:`~.connection.CHECK_CLIENT`) is set
#: again after RESET ALL.
RESET_SESSION = (
    "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; DEALLOCATE ALL;"
    " UNLISTEN *; SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES; " + CHECK_CLIENT
)

#: A worker's note to the template: "I had no session to give back; have one ready."
WANT = b"want"

_ENCRYPTED = (
    "SELECT coalesce((SELECT encrypted FROM pg_stat_gssapi WHERE pid = pg_backend_pid()), false)"
)


@dataclass
class Loan:
    """A connection lent to one worker, and the way back to the template."""

    #: the session lent (None: the worker connects itself)
    conn: psycopg.Connection | None
    #: descriptor number of the connection's socket (the same in both processes)
    fd: int
    #: the worker's pid, once the template knows it
    pid: int | None = None
    #: the worker's end of the return socket pair
    back: socket.socket | None = field(default=None, repr=False)
    #: the template's configuration, for the worker (it need not read the file again)
    config: Config | None = None
    #: the worker took the session (:func:`take_lent`)
    taken: bool = False


#: The loan this process (a forked worker) took from its template, if any.
_IN_HAND: Loan | None = None


def loan_in_hand() -> Loan | None:
    """In a worker forked by its template: the connection (and configuration) it
    was lent, or None."""
    return _IN_HAND


def take_lent() -> psycopg.Connection | None:
    """The session this worker was lent, the first time it is asked for; None
    after that, or when it was lent none."""
    loan = _IN_HAND
    if loan is None or loan.conn is None or loan.taken:
        return None
    loan.taken = True
    return loan.conn


def lending_wanted() -> bool:
    """Is lending on in this environment (``PEPSI_WORKER_LEND_SESSIONS`` is not ``0``)?"""
    return os.environ.get(LEND_ENV, "1").strip() != "0"


def protocol_lender() -> Lender | None:
    """In the template of a program that speaks the protocol itself (``fork_point``):
    what lends sessions to its workers that :func:`connect`. It connects only
    when such a worker ends and asks for one, so a program that never calls
    :func:`connect` opens nothing through it."""
    stage, dsn = os.environ.get("PEPSI_STAGE", ""), os.environ.get("PEPSI_DSN", "")
    if not stage or not dsn or not lending_wanted():
        return None
    return Lender(
        connector(dsn, stage, LEND_CONNECT_TIMEOUT, fast_adapters=False), workers_connect=False
    )


def connect() -> psycopg.Connection:
    """A database connection for a program that speaks the protocol itself:
    autocommit, to ``$PEPSI_DSN``, named ``pepsi-worker STAGE``. In a worker
    forked by the stage's template (``fork_point()``) it is, when one waits,
    the session a worker of the stage gave back as it ended (reset: no
    settings, prepared statements, locks or temporary tables of its own).
    End the program with ``leave(0, conn)`` to give it back in turn."""
    lent = take_lent()
    if lent is not None:
        return lent
    dsn = os.environ.get("PEPSI_DSN", "")
    return connector(dsn, os.environ.get("PEPSI_STAGE", "?"), fast_adapters=False)()


class Lender:
    """The template's side: lends connections to the workers it forks and takes
    back the sessions they return."""

    def __init__(
        self,
        connect: Connect,
        config: Config | None = None,
        *,
        workers_connect: bool = True,
        idle_max: int = IDLE_MAX,
        rehearse: Callable[[psycopg.Connection], object] | None = None,
    ) -> None:
        """``connect`` opens a session for the next worker; ``config`` goes with
        each worker forked; ``workers_connect``: every worker is known to use a
        session (the SDK's), so a fork that finds none waiting has one opened
        for the next (else that waits until a worker gives one back or asks);
        ``idle_max``: sessions at most waiting (a stage of PARALLELISM 1 needs
        two: its replacement's and its warm spare's); ``rehearse(conn)``: run
        once on the first session opened here, before any worker gets it (what
        every worker asks first, so that the caches it fills are built once,
        here, and each forked worker inherits them)."""
        self._connect = connect
        self._rehearse = rehearse
        self.config = config
        #: sessions at most waiting for the next workers
        self.idle_max = idle_max
        #: open a session after a fork found none (the workers use them)
        self.open_after_miss = workers_connect
        self._returns, self._back = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._returns.setblocking(False)
        #: what a lent socket's number points at meanwhile (opened once: blanking
        #: a number after a fork must not fail for want of a descriptor)
        self._devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        #: given back and waiting: (connection, since)
        self.idle: list[tuple[psycopg.Connection, float]] = []
        #: lent to a live worker, by descriptor number (pointed at /dev/null here)
        self.lent: dict[int, Loan] = {}
        self._connect_failed_at: float | None = None
        #: sessions workers asked for, for their replacements (opened between
        #: requests, one per loop turn)
        self._wanted = 0
        #: False once a connection turned out to be encrypted: lend nothing more
        self.lending = True

    def fileno(self) -> int:
        """The return socket: readable when a worker gave a session back."""
        return self._returns.fileno()

    def deadline(self) -> float | None:
        """When the template should look again without a request (monotonic): at
        once when a worker asked for a session that is not opened yet, when the
        oldest waiting connection expires, or None."""
        if self._wanted and self.lending:
            return 0.0
        if not self.idle:
            return None
        return min(since for _, since in self.idle) + IDLE_SECONDS

    def take(self, now: float) -> Loan | None:
        """What goes with the worker about to be forked: a waiting session, if a
        healthy one is there (else the worker connects itself), and the
        configuration. None when lending is off. (The template's loop has
        collected what workers gave back just before the request.)"""
        if not self.lending:
            return None
        while self.idle:
            conn, _ = self.idle.pop(0)  # the oldest: every waiting one stays in use
            if _healthy(conn):
                return self._loan(conn)
            _close(conn)
        if self.open_after_miss:
            # This worker connects itself, and can never pass that session on:
            # have one ready for the next fork, so that the stage keeps a spare.
            self._wanted += 1
        return self._loan(None)

    def _prepare(self, now: float) -> None:
        """Open one session a worker asked for (it ended without one to give
        back) or a fork missed, so that the next worker forked gets it. Done
        between requests, never to serve one (a request that comes meanwhile
        waits)."""
        if len(self.idle) >= self.idle_max or not self.lending:
            return
        if self._connect_failed_at is not None and now - self._connect_failed_at < RETRY_SECONDS:
            return
        try:
            conn = self._connect()
            encrypted = conn.pgconn.ssl_in_use or conn.execute(_ENCRYPTED).fetchone()[0]  # type: ignore[index]
        except psycopg.Error:
            self._connect_failed_at = now
            return
        if encrypted or conn.prepare_threshold is None:
            # encrypted: the state lives in this process; None: behind a pooler
            # (connector), where a new client connection costs no backend and a
            # reset would reach whichever server session the pooler picks
            self.lending = False
            _close(conn)
            return
        if self._rehearse is not None:
            rehearse, self._rehearse = self._rehearse, None
            try:
                rehearse(conn)
            except psycopg.Error:
                if conn.broken:
                    self._connect_failed_at = now
                    _close(conn)
                    return
        self._connect_failed_at = None
        self._wait(conn, now)

    def _loan(self, conn: psycopg.Connection | None) -> Loan:
        fd = conn.pgconn.socket if conn is not None else -1
        return Loan(conn, fd, back=self._back, config=self.config)

    def lent_to(self, loan: Loan, pid: int | None) -> None:
        """In the template, right after the fork: give up the socket (its number
        now names /dev/null) and remember the loan; called again with the
        worker's ``pid`` once it is known."""
        if loan.conn is None:
            return
        if loan.fd not in self.lent:
            os.dup2(self._devnull, loan.fd, inheritable=False)
            self.lent[loan.fd] = loan
        loan.pid = pid

    def forget(self, loan: Loan) -> None:
        """A lent session whose worker never started: the socket died with it."""
        if loan.conn is not None and self.lent.pop(loan.fd, None) is loan:
            _close(loan.conn)  # its goodbye goes to /dev/null

    def not_lent(self, loan: Loan, now: float) -> None:
        """The fork failed: the connection waits for the next worker."""
        if loan.conn is not None:
            self._wait(loan.conn, now)

    def in_worker(self, loan: Loan | None) -> None:
        """In the forked worker: keep ``loan``; let go of everything else the
        template holds: the waiting connections' sockets are the template's,
        and the numbers of the sessions lent to siblings (at /dev/null here)
        are closed, so that this worker has no descriptor of theirs."""
        global _IN_HAND
        self._returns.close()
        others = [conn for conn, _ in self.idle]
        others += [lent.conn for lent in self.lent.values() if lent is not loan and lent.conn]
        for conn, _ in self.idle:
            os.dup2(self._devnull, conn.pgconn.socket, inheritable=False)
        for conn in others:
            # Closed now rather than when the collector finds the copies: each
            # writes its goodbye to /dev/null and frees its number, and nothing
            # later can close a number this worker has reused meanwhile.
            _close(conn)
        self.idle.clear()
        self.lent.clear()
        os.close(self._devnull)
        if loan is None:
            self._back.close()  # no session to give back, nothing to ask for
        _IN_HAND = loan

    def collect(self, now: float, between_requests: bool = False) -> None:
        """Take back every session workers returned; forget loans whose worker is
        gone without returning (their sockets died with it); expire waiting ones.
        ``between_requests`` (no fork is waiting): open the session a worker
        asked for, if any."""
        wanted = self._wanted
        while True:
            try:
                msg, fds, _, _ = socket.recv_fds(self._returns, 32, 1)
            except (BlockingIOError, InterruptedError):
                break
            if not msg and not fds:
                break
            wanted += msg == WANT
            self.open_after_miss |= bool(msg)  # a worker uses sessions
            loan = self.lent.pop(int(msg), None) if msg.isdigit() else None
            for fd in fds:
                if loan is not None and fd != loan.fd:
                    os.dup2(fd, loan.fd, inheritable=False)
                os.close(fd)
            if loan is not None and fds:
                self._wait(loan.conn, now)
        for fd, loan in list(self.lent.items()):
            if loan.pid is not None and not _alive(loan.pid):
                del self.lent[fd]
                _close(loan.conn)  # writes its goodbye to /dev/null, frees the number
        for conn, since in list(self.idle):
            if now - since >= IDLE_SECONDS:
                self.idle.remove((conn, since))
                _close(conn)
        self._wanted = wanted
        if wanted and between_requests:
            self._wanted -= 1
            self._prepare(now)

    def _wait(self, conn: psycopg.Connection, now: float) -> None:
        if len(self.idle) >= self.idle_max:
            old, _ = self.idle.pop(0)
            _close(old)
        self.idle.append((conn, now))

    def close(self) -> None:
        """The template ends: close the waiting connections (the lent ones are the
        workers')."""
        for conn, _ in self.idle:
            _close(conn)
        self.idle.clear()
        os.close(self._devnull)


def give_back(conn: psycopg.Connection) -> bool:
    """In a worker that is ending normally: reset the session and send it back to
    the template, if ``conn`` is the one it was lent and is idle. True when
    given back (then the caller must exit without closing it). A worker with
    no session to give back asks the template to have one ready for its
    replacement instead."""
    loan = _IN_HAND
    if loan is None or loan.back is None:
        return False
    if conn.broken or conn.closed or conn not in OPENED_HERE:
        # broken: the server may be out of reach, the template need not try
        # now; a program's own connection: its replacement connects alike
        return False
    if conn is not loan.conn or conn.info.transaction_status != _IDLE:
        try:
            loan.back.send(WANT, socket.MSG_DONTWAIT)
        except OSError:
            pass
        return False
    try:
        conn.execute(RESET_SESSION)
        if conn.info.transaction_status != _IDLE or conn.pgconn.socket != loan.fd:
            return False
        # (a busy template's queue full: close instead of waiting for it)
        socket.send_fds(loan.back, [str(loan.fd).encode()], [loan.fd], socket.MSG_DONTWAIT)
    except (psycopg.Error, OSError):
        return False
    # The session is the template's now: this process keeps the number (for
    # whatever still holds ``conn``: a thread, an atexit function) but not the
    # socket, so nothing done here from now on can reach the next worker's session.
    try:
        _blank(loan.fd)
    except OSError:
        pass  # (no descriptor left for /dev/null: the process is about to exit anyway)
    return True


_IDLE = psycopg.pq.TransactionStatus.IDLE


def _healthy(conn: psycopg.Connection) -> bool:
    """A waiting connection the server has said nothing on (an idle backend
    sends nothing; a readable socket means it closed or is closing)."""
    if conn.closed or conn.broken:
        return False
    try:
        readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def _blank(fd: int) -> None:
    """Point descriptor ``fd`` at /dev/null: the socket it named is let go, the
    number stays taken (so nothing else gets it while a loan refers to it)."""
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        os.dup2(devnull, fd, inheritable=False)
    finally:
        os.close(devnull)


def _close(conn: psycopg.Connection) -> None:
    try:
        conn.close()
    except Exception:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
