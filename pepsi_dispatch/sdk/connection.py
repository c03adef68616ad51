"""The SDK's one database connection: how it is opened, and replaced once it broke."""

from __future__ import annotations

import os
import sys
import time
import weakref
from collections.abc import Callable

import psycopg

from ..backoff import Backoff
from ..contract import EX_TEMPFAIL
from ..pooling import pooler_safe
from .adapters import use_fast_adapters

__all__ = [
    "CHECK_CLIENT",
    "EX_TEMPFAIL",
    "OPENED_HERE",
    "RECONNECT_TIMEOUT",
    "Connect",
    "ConnectionHolder",
    "connector",
]

#: While one of its statements runs, the server looks every second whether this
#: worker is still there (``client_connection_check_interval``, PostgreSQL 14 and
#: later, where the platform has it; elsewhere the block changes nothing), on a
#: direct connection (behind a pooler a session setting would reach whichever server
#: session the pooler hands out next, so nothing is set there). A worker
#: killed at MAX_RUNTIME in the middle of a long statement then ends that
#: statement, and gives up its rows' locks, within a second instead of when the
#: statement would have ended: the dispatcher's timeout record and release of those
#: rows wait on those locks, and with them every stage.
CHECK_CLIENT = (
    "DO $$BEGIN PERFORM set_config('client_connection_check_interval', '1s', false);"
    " EXCEPTION WHEN OTHERS THEN NULL; END$$"
)

#: How long a worker tries to reconnect after losing its database connection (seconds).
RECONNECT_TIMEOUT = float(os.environ.get("PEPSI_WORKER_RECONNECT_TIMEOUT", "60"))

#: Opens a new connection (autocommit).
Connect = Callable[[], psycopg.Connection]

#: Connections a :func:`connector` opened (a program's own are not among them).
OPENED_HERE: weakref.WeakSet[psycopg.Connection] = weakref.WeakSet()


def connector(
    dsn: str, stage: str, timeout: int | None = None, fast_adapters: bool = True
) -> Connect:
    """How this stage's worker connects: autocommit, named after the stage, with
    the SDK's faster adapters (:func:`~.adapters.use_fast_adapters`) unless
    ``fast_adapters`` is False; with ``timeout``, waiting at most that many
    seconds for the server (or the DSN's own ``connect_timeout`` when it is
    smaller). Behind a connection pooler (PgBouncer in transaction mode) the
    connection prepares no statement (:func:`pepsi_dispatch.pooling.pooler_safe`:
    one round trip at connect tells). On a direct connection the server checks
    for the worker while a statement runs (:data:`CHECK_CLIENT`, one more round
    trip at connect)."""
    options: dict[str, object] = {}
    if timeout is not None:
        options["connect_timeout"] = _capped_timeout(dsn, timeout)

    def connect() -> psycopg.Connection:
        conn = psycopg.connect(
            dsn, autocommit=True, application_name=f"pepsi-worker {stage}", **options
        )
        if fast_adapters:
            use_fast_adapters(conn)
        try:
            if not pooler_safe(conn):  # a session setting: never behind a pooler
                conn.execute(CHECK_CLIENT)
        except BaseException:
            conn.close()
            raise
        OPENED_HERE.add(conn)
        return conn

    return connect


def _capped_timeout(dsn: str, cap: int) -> int:
    """``cap``, or the DSN's (or PGCONNECT_TIMEOUT's) positive connect_timeout if smaller."""
    try:
        given = psycopg.conninfo.conninfo_to_dict(dsn).get("connect_timeout")
    except psycopg.Error:
        given = None
    given = given or os.environ.get("PGCONNECT_TIMEOUT")
    try:
        value = int(str(given)) if given is not None else 0
    except ValueError:
        value = 0
    return min(cap, value) if value > 0 else cap


class ConnectionHolder:
    """Holds the worker's connection; :meth:`reconnect` replaces a broken one.

    Everything that runs statements reads :attr:`conn` when it starts, so a
    batch redone after a reconnect uses the new connection.
    """

    def __init__(
        self,
        conn: psycopg.Connection,
        connect: Connect | None = None,
        timeout: float = RECONNECT_TIMEOUT,
    ) -> None:
        self.conn = conn
        self._connect = connect
        self.timeout = timeout

    @property
    def broken(self) -> bool:
        """True when the connection was lost (not when a statement merely failed)."""
        return self.conn.broken

    def _open(self) -> psycopg.Connection:
        if self._connect is None:
            raise psycopg.OperationalError("no way to reconnect")
        return self._connect()

    def reconnect(self) -> None:
        """New connection with backoff; raises the last error after ``timeout`` seconds."""
        deadline = time.monotonic() + self.timeout
        backoff = Backoff(0.1, 2.0)
        while True:
            try:
                self.conn = self._open()
            except psycopg.OperationalError:
                if time.monotonic() + backoff.peek() > deadline:
                    raise
                time.sleep(backoff.next())
            else:
                print("pepsi worker: reconnected to the database", file=sys.stderr)
                return

    def close(self) -> None:
        """Close the current connection, ignoring errors."""
        try:
            self.conn.close()
        except Exception:
            pass
