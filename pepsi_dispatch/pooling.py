"""Connection poolers between a client and PostgreSQL (PgBouncer and the like).

A pooler in transaction mode gives each transaction of a client whichever
server session is free, so nothing may live in a session from one transaction
to the next: no prepared statement (psycopg prepares a statement once it ran
it five times on a connection: ``prepare_threshold``), no ``SET`` without
``LOCAL``, no session advisory lock, no ``LISTEN``, no temporary table.

Every such pooler hands its clients a backend key of its own at connect (it
must route their cancel requests), so a connection that reaches PostgreSQL
directly is told apart by one statement: the key's process id is the backend
that runs its statements. PgBouncer's ``max_prepared_statements`` (1.21 and
later) makes protocol-level prepared statements work in transaction mode;
older versions, and other poolers, do not, which is why a client behind any
pooler prepares nothing: :func:`pooler_safe`.
"""

from __future__ import annotations

import psycopg

__all__ = ["behind_pooler", "pooler_safe"]


def behind_pooler(conn: psycopg.Connection) -> bool:
    """True when ``conn`` goes through a connection pooler: the backend key it
    got at connect names another process than the one running its statements.
    One round trip; run it on an idle autocommit connection."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    return row is not None and row[0] != conn.info.backend_pid


def pooler_safe(conn: psycopg.Connection) -> bool:
    """Behind a pooler, have ``conn`` prepare no statement (its next transaction
    may run in another server session, where the prepared one does not exist);
    a direct connection keeps psycopg's default. True when behind a pooler."""
    pooled = behind_pooler(conn)
    if pooled:
        conn.prepare_threshold = None
    return pooled
