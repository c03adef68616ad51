"""Python API to put messages into the queue (ingress).

    from pepsi_dispatch.enqueue import connect, enqueue, enqueue_many

    with connect() as conn:                      # PEPSI_DSN, else the configuration's DSN
        one = enqueue(conn, "fetch", {"url": "https://example.org/"})
        ids = enqueue_many(conn, "fetch", [{"n": i} for i in range(10_000)])

Each call is one statement (``pepsi.enqueue`` / ``pepsi.enqueue_many``), so a
bulk insert is one notification to the dispatcher. ``enqueue_many`` sends large
lists in chunks (one statement and one commit per chunk, unless the caller's
connection is inside a transaction). The payload is any JSON-serialisable value.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

__all__ = ["DEFAULT_CHUNK", "connect", "enqueue", "enqueue_many", "resolve_dsn"]

#: Payloads per ``pepsi.enqueue_many`` statement.
DEFAULT_CHUNK = 5000


def resolve_dsn(dsn: str | None = None, config_path: str | None = None) -> str:
    """The DSN to use: ``dsn`` if given, else ``PEPSI_DSN``, else ``[database] DSN``.

    The configuration is found as every tool finds it (``config_path``,
    ``$PEPSI_CONFIG``, ``~/.config/pepsi.conf``, ``/etc/pepsi.conf``, defaults).
    """
    if dsn:
        return dsn
    from pepsi_dispatch.config import load_config

    return load_config(config_path).dsn  # PEPSI_DSN already wins there


def connect(dsn: str | None = None, config_path: str | None = None) -> psycopg.Connection:
    """An autocommit connection to the queue's database (see :func:`resolve_dsn`)."""
    return psycopg.connect(
        resolve_dsn(dsn, config_path), autocommit=True, application_name="pepsi-enqueue"
    )


def enqueue(conn: psycopg.Connection, stage: str, payload: Any = None) -> int:
    """Enqueue one message at ``stage``; returns its id.

    Raises:
        psycopg.errors.InvalidParameterValue: ``stage`` is not a valid stage name.
    """
    row = conn.execute(
        "SELECT pepsi.enqueue(%s, %s)", (stage, Jsonb({} if payload is None else payload))
    ).fetchone()
    assert row is not None
    return int(row[0])


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def enqueue_many(
    conn: psycopg.Connection,
    stage: str,
    payloads: Iterable[Any],
    chunk_size: int = DEFAULT_CHUNK,
) -> list[int]:
    """Enqueue one message per payload at ``stage``, in order; returns the ids in order."""
    if chunk_size < 1:
        raise ValueError("chunk_size must be positive")
    ids: list[int] = []
    for chunk in _chunks(payloads, chunk_size):
        cur = conn.execute(
            "SELECT pepsi.enqueue_many(%s, %s::jsonb[])",
            (stage, [Jsonb({} if p is None else p) for p in chunk]),
        )
        ids.extend(int(r[0]) for r in cur.fetchall())
    return ids
