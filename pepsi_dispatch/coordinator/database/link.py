"""The dispatcher's database link as a state machine (:class:`LinkState`).

Its states and transitions are drawn in docs/INTERNALS.md, "The database link".

A query error never gives up the advisory lock (HOLDING keeps both
connections); a work-only reconnect keeps the listen connection, so its lock
and LISTEN; only RECONNECT_ALL takes the lock again, retaking it from our own
old listen session if the server still runs it (:meth:`DatabaseLink._retake_later`).
What a reconnect means for the rows (registration, strays, a claim pass, the
overlay) is the dispatcher's business: it passes ``resume`` to :meth:`reconnect`.
"""

from __future__ import annotations

import enum
import logging
import selectors
import time
from collections.abc import Callable

import psycopg

from pepsi_dispatch.backoff import Backoff
from pepsi_dispatch.contract import INF
from pepsi_dispatch.coordinator.database.port import DispatchStore

log = logging.getLogger(__name__)

#: Reconnect backoff (seconds): first, cap. Also the hold after a query error.
RECONNECT_FIRST = 0.1
RECONNECT_MAX = 5.0
#: After a reconnect finds the lock still held by our OLD listen session (its
#: server backend outlived a network partition longer than the keepalives):
#: how long to wait for that backend to go (it is terminated) before deciding
#: that another dispatcher took the lock; and the retry pause meanwhile.
LOCK_RETAKE_WINDOW = 5.0
LOCK_RETAKE_RETRY = 0.2


class LinkState(enum.Enum):
    """Where the database link is."""

    #: both connections up; database work may run.
    UP = "up"
    #: a query error with both connections intact: kept, no database work before hold_until.
    HOLDING = "holding after an error"
    #: the work connection broke; the listen one (lock, LISTEN) is kept.
    RECONNECT_WORK = "reconnecting the work connection"
    #: the listen connection broke (or we never connected): lock and LISTEN to redo.
    RECONNECT_ALL = "reconnecting both"
    #: another dispatcher holds the lock: stop, sending only fenced writes.
    LOCK_LOST = "lock lost"


def error_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class DatabaseLink:
    """The two connections' health, the reconnect schedule and the lock retake."""

    def __init__(self, db: DispatchStore, sel: selectors.BaseSelector) -> None:
        self.db = db
        #: called with the time when the LISTEN socket is readable (set by watch_listen).
        self.on_listen: Callable[[float], None] = lambda now: None
        self.sel = sel
        #: not connected yet: start() brings it UP.
        self.state = LinkState.RECONNECT_ALL
        #: HOLDING: no database work before this (monotonic seconds).
        self.hold_until = 0.0
        self.hold = Backoff(RECONNECT_FIRST, RECONNECT_MAX)
        #: RECONNECT_*: the next attempt (INF before the first connect).
        self.reconnect_at = INF
        self.backoff = Backoff(RECONNECT_FIRST, RECONNECT_MAX)
        self.failures = 0
        self.last_down_log = -INF
        self.last_query_error_log = -INF
        #: backend pid of our listen connection (holder of the lock) and, while
        #: retaking the lock from it after a reconnect, the deadline (0 = none).
        self.listen_pid = 0
        self.retake_deadline = 0.0
        self.listen_fd = -1
        #: LOCK_LOST: why (the fatal message).
        self.lock_lost: str | None = None

    # == state ===================================================================
    @property
    def connected(self) -> bool:
        """Both connections are open (UP, or HOLDING after a query error)."""
        return self.state is LinkState.UP or self.state is LinkState.HOLDING

    def ready(self, now: float) -> bool:
        """May database work run now? (A hold that is over ends here.)"""
        if self.state is LinkState.HOLDING and now >= self.hold_until:
            self.state = LinkState.UP
        return self.state is LinkState.UP

    def held(self, now: float) -> bool:
        """HOLDING, and the hold is not over."""
        return self.state is LinkState.HOLDING and now < self.hold_until

    def up(self, listen_pid: int) -> None:
        """Connected at start-up: the lock is ours (held by the listen session
        ``listen_pid``), LISTEN is on."""
        assert self.state is not LinkState.LOCK_LOST, "up() after the lock was lost"
        self.state = LinkState.UP
        self.listen_pid = listen_pid

    def worked(self) -> None:
        """A pipeline went through: the next query error holds for the first delay."""
        self.hold.reset()

    def wait_ready(
        self,
        now: float,
        deadline: float,
        clock: Callable[[], float],
        reconnect: Callable[[float], None],
    ) -> bool:
        """At shutdown: True if database work may run now; else sleep towards
        the hold's end or the next reconnect (not past ``deadline``), reconnect
        when that is due, and return False (the caller looks again)."""
        if self.ready(now):
            return True
        if now >= deadline:
            return False
        if self.connected:
            time.sleep(max(0.0, min(self.hold_until, deadline) - now))
            return False
        time.sleep(max(0.0, min(self.reconnect_at, deadline) - now))
        reconnect(clock())
        return False

    # == the listen socket ======================================================
    def watch_listen(self, on_ready: Callable[[float], None] | None = None) -> None:
        """Watch the LISTEN connection's socket; ``on_ready(now)`` is called when it
        is readable (given once at start, kept for the re-registrations after a
        reconnect)."""
        if on_ready is not None:
            self.on_listen = on_ready
        self.listen_fd = self.db.listen_fileno()
        self.sel.register(self.listen_fd, selectors.EVENT_READ, self.on_listen)

    def _unwatch_listen(self) -> None:
        if self.listen_fd >= 0:
            # By the number registered: a broken connection no longer knows its socket.
            try:
                self.sel.unregister(self.listen_fd)
            except (KeyError, ValueError):
                pass
            self.listen_fd = -1

    # == failure =================================================================
    def lost(self, now: float, exc: BaseException) -> None:
        """A database call failed: keep what works, reconnect only what is broken.

        A plain query error (lock_timeout, statement_timeout, a deadlock after
        its retries, a bad argument) leaves both connections usable: they are
        kept -- the listen connection holds the advisory lock, and giving it up
        would let another dispatcher start and reset our in-flight rows -- and
        the database work is retried after a growing pause (HOLDING). A broken
        work connection alone is reopened alone; only a broken listen
        connection means a full reconnect (lock, LISTEN, claim pass).
        """
        listen_dead = self.db.listen_dead()
        if self.connected and not listen_dead and not self.db.work_dead():
            self._hold(now, exc)
            return
        if self.connected:
            log.warning(
                "database trouble (%s); reconnecting%s, workers keep running",
                error_line(exc),
                "" if listen_dead else " the work connection",
            )
            self.backoff.reset()
            self.failures = 0
            self.last_down_log = now
        if listen_dead:
            self.state = LinkState.RECONNECT_ALL
            self._unwatch_listen()
            self.db.close()
        else:
            self.state = LinkState.RECONNECT_WORK
            self.db.close_work()
        self.reconnect_at = now + self.backoff.next()

    def _hold(self, now: float, exc: BaseException) -> None:
        self.state = LinkState.HOLDING
        hold = self.hold.next()
        self.hold_until = now + hold
        if now - self.last_query_error_log >= 30.0:
            self.last_query_error_log = now
            log.warning(
                "database error (%s); connections kept, retrying in %g s (growing)",
                error_line(exc),
                hold,
            )
        else:
            log.debug("database error (%s); retrying in %g s", error_line(exc), hold)

    # == reconnect ===============================================================
    def reconnect(self, now: float, resume: Callable[[float], None]) -> LinkState | None:
        """One reconnect attempt. ``resume(now)`` runs once the lock is ours
        (registration, heartbeat, stray rows) and may raise psycopg.Error.

        Returns which reconnect succeeded (RECONNECT_WORK: lock and LISTEN were
        kept; RECONNECT_ALL: both renewed), or None: still down (tried again at
        ``reconnect_at``) or the lock is lost (``state`` is LOCK_LOST).
        """
        work_only = self.state is LinkState.RECONNECT_WORK and not self.db.listen_dead()
        if not work_only:
            self._unwatch_listen()
        try:
            if not self._connect(now, work_only):
                return None
            if not work_only:
                self.db.start_listening()
            resume(now)
        except psycopg.Error as exc:
            self._failed(now, exc, work_only)
            return None
        done = LinkState.RECONNECT_WORK if work_only else LinkState.RECONNECT_ALL
        self.state = LinkState.UP
        self.hold_until = 0.0
        self.retake_deadline = 0.0
        log.info(
            "database connection re-established%s; %s, full claim pass",
            f" after {self.failures} failed attempt(s)" if self.failures else "",
            "work connection only (lock and LISTEN kept)" if work_only else "LISTEN renewed",
        )
        self.failures = 0
        self.backoff.reset()
        if not work_only:
            self.watch_listen()
        return done

    def _connect(self, now: float, work_only: bool) -> bool:
        """Open what is closed and take the lock; False if not now (or never)."""
        if work_only:
            # The listen connection still holds the lock and LISTENs.
            self.db.connect_work()
            return True
        self.db.connect()
        if self.db.try_lock():
            # Known at once: should the rest of this attempt fail, the next one
            # may find this session still holding the lock, and must know it as ours.
            self.listen_pid = self.db.listen_pid()
            return True
        if self._retake_later(now):
            return False
        holders = self.db.lock_holders()
        self.lock_lost = (
            f"lost the database to another dispatcher while reconnecting ({holders}); stopping"
        )
        self.state = LinkState.LOCK_LOST
        return False

    def _failed(self, now: float, exc: psycopg.Error, work_only: bool) -> None:
        self.failures += 1
        if now - self.last_down_log >= 30.0:
            self.last_down_log = now
            log.warning(
                "database still unreachable after %d attempt(s): %s; retrying every %g s",
                self.failures,
                error_line(exc),
                RECONNECT_MAX,
            )
        else:
            log.debug("reconnect failed: %s", error_line(exc))
        if work_only:
            self.db.close_work()
        else:
            self.db.close()
        self.reconnect_at = now + self.backoff.next()

    def _retake_later(self, now: float) -> bool:
        """try_lock failed on reconnect: is the holder our own old session?

        After a network partition longer than the client keepalives, the
        server-side backend of the OLD listen connection may still be alive and
        hold the lock. Then it is terminated and the reconnect retried shortly
        (True); only once that window is over, or when the holder is another
        session, is the lock lost (False). The work connection is open here.
        """
        if self.retake_deadline and now >= self.retake_deadline:
            return False
        pids = self.db.lock_pids()
        old = self.listen_pid
        if pids and old not in pids:
            return False  # another session holds it
        if not self.retake_deadline:
            self.retake_deadline = now + LOCK_RETAKE_WINDOW
        if old in pids:
            log.warning(
                "reconnect: the dispatcher lock is still held by our old listen session"
                " (server pid %d, from before the connection broke); terminating it",
                old,
            )
            try:
                self.db.terminate_backend(old)
            except psycopg.Error as exc:
                log.warning("cannot terminate server pid %d: %s", old, error_line(exc))
        self.db.close()
        self.reconnect_at = now + LOCK_RETAKE_RETRY
        return True


__all__ = ["DatabaseLink", "LinkState", "RECONNECT_FIRST", "RECONNECT_MAX", "error_line"]
