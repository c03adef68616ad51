"""Python API to put messages into the queue (ingress).

    from pepsi_dispatch.enqueue import connect, enqueue, enqueue_many

    with connect() as conn:                      # PEPSI_DSN, else the configuration's DSN
        one = enqueue(conn, "fetch", {"url": "https://example.org/"})
        ids = enqueue_many(conn, "fetch", [{"n": i} for i in range(10_000)])

Each call is one statement (``pepsi.enqueue`` / ``pepsi.enqueue_lines``), so a
bulk insert is one notification to the dispatcher. ``enqueue_many`` sends large
lists in chunks (one statement and one commit per chunk, unless the caller's
connection is inside a transaction): each chunk is one ``text[]`` of JSON texts
in binary form, parsed, checked and inserted by one set-based statement of
``pepsi.enqueue_lines``. ``enqueue_lines`` does the same for JSON texts the
caller already has (JSON lines), all chunks in one transaction. A payload is a
JSON object (a ``dict``; None means ``{}``); anything else raises ``ValueError``
before the database is asked.

``not_before`` (a timezone-aware ``datetime``, or a ``timedelta`` from now) delays
the message: it waits as ``paused`` until then and is not counted as a retry::

    enqueue(conn, "report", {"day": "2026-11-30"}, not_before=timedelta(minutes=10))

``priority`` (default 0, negative allowed): within a stage the highest runs
first, equal priorities in enqueue order; the message keeps it through every
stage. ``dedupe_key``: while a message with that key is pending, running or
paused anywhere in the pipeline, enqueuing the key again inserts nothing and
returns that message's id (graphile-worker's ``job_key``, PgQueuer's
``dedupe_key``); once it is done, failed or cancelled the key is free::

    enqueue(conn, "invoice", {"order": 17}, priority=5, dedupe_key="invoice-17")
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

__all__ = ["DEFAULT_CHUNK", "connect", "enqueue", "enqueue_lines", "enqueue_many", "resolve_dsn"]

#: Payloads per ``pepsi.enqueue_lines`` statement (measured: 10,000 to 50,000
#: cost the same per row; docs/BENCHMARKS.md, *Bulk enqueue*).
DEFAULT_CHUNK = 20_000

_LINES_SQL = "SELECT pepsi.enqueue_lines(%s, %b::text[], %s, %s::int, %b::text[], %s, %s::bigint)"


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


def _payload(payload: Any, what: str = "payload") -> Jsonb:
    if payload is None:
        return Jsonb({})
    if not isinstance(payload, dict):
        raise ValueError(f"{what} must be a JSON object (a dict), not {type(payload).__name__}")
    return Jsonb(payload)


def _when(not_before: datetime | timedelta | None) -> datetime | None:
    """``not_before`` as an absolute, timezone-aware time (None: now)."""
    if not_before is None:
        return None
    if isinstance(not_before, timedelta):
        return datetime.now(UTC) + not_before
    if not_before.tzinfo is None:
        raise ValueError("not_before must be timezone-aware (or a timedelta from now)")
    return not_before


def enqueue(
    conn: psycopg.Connection,
    stage: str,
    payload: Any = None,
    not_before: datetime | timedelta | None = None,
    priority: int = 0,
    dedupe_key: str | None = None,
) -> int:
    """Enqueue one message at ``stage``; returns its id.

    ``not_before``: run it no earlier than this (aware ``datetime``, or ``timedelta``
    from now); until then it waits as ``paused``. None or a past time: at once.
    ``priority``: higher runs first within a stage (default 0).
    ``dedupe_key``: a key a live message already carries returns that message's
    id and inserts nothing (two producers racing for one key get one message).

    Raises:
        ValueError: the payload is not a dict, or ``not_before`` is a naive datetime.
        psycopg.errors.InvalidParameterValue: ``stage`` is not a valid stage name,
            or ``dedupe_key`` is empty or longer than 512 bytes.
    """
    args: tuple[Any, ...] = (stage, _payload(payload), _when(not_before))
    if priority or dedupe_key is not None:
        sql = "SELECT pepsi.enqueue(%s, %s, %s, %s::int, %s::text)"
        args += (int(priority), dedupe_key)
    else:  # the 3-argument call: also works on a schema older than priorities
        sql = "SELECT pepsi.enqueue(%s, %s, %s)"
    row = conn.execute(sql, args).fetchone()
    assert row is not None
    return int(row[0])


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def _send(
    conn: psycopg.Connection,
    stage: str,
    texts: list[str],
    when: datetime | None,
    priority: int,
    keys: list[str | None] | None,
    key_field: str | None,
    first_line: int,
) -> list[int]:
    cur = conn.execute(_LINES_SQL, (stage, texts, when, int(priority), keys, key_field, first_line))
    return [r[0] for r in cur.fetchall()]


def enqueue_many(
    conn: psycopg.Connection,
    stage: str,
    payloads: Iterable[Any],
    chunk_size: int = DEFAULT_CHUNK,
    not_before: datetime | timedelta | None = None,
    priority: int = 0,
    dedupe_keys: Sequence[str | None] | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[int]:
    """Enqueue one message per payload at ``stage``, in order; returns the ids in order.

    ``not_before`` and ``priority`` as for :func:`enqueue`, for every message
    (one time for all chunks, computed once). ``dedupe_keys``: None, or one key
    (or None) per payload; an element whose key a live message (or an earlier
    element) holds returns that message's id. ``progress(n)`` is called with
    the number enqueued so far after each chunk.
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be positive")
    when = _when(not_before)
    ids: list[int] = []
    done = 0
    keys = None if dedupe_keys is None else list(dedupe_keys)
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    for chunk in _chunks(payloads, chunk_size):
        texts = []
        for i, p in enumerate(chunk):
            if p is None:
                p = {}
            elif not isinstance(p, dict):
                raise ValueError(
                    f"payload {done + i + 1} must be a JSON object (a dict), not {type(p).__name__}"
                )
            texts.append(dumps(p))
        part = None if keys is None else keys[done : done + len(chunk)]
        if part is not None and len(part) != len(chunk):
            raise ValueError("dedupe_keys must have one element per payload")
        ids.extend(_send(conn, stage, texts, when, priority, part, None, done + 1))
        done += len(chunk)
        if progress is not None:
            progress(done)
    if keys is not None and len(keys) != done:
        raise ValueError("dedupe_keys must have one element per payload")
    return ids


def enqueue_lines(
    conn: psycopg.Connection,
    stage: str,
    lines: Sequence[str],
    chunk_size: int = DEFAULT_CHUNK,
    not_before: datetime | timedelta | None = None,
    priority: int = 0,
    key_field: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[int]:
    """Enqueue one message per JSON line at ``stage``, all or nothing; returns the ids.

    ``lines``: JSON texts, one object each, as read (the database parses them;
    Python does not). A blank line (only whitespace) is skipped and counted:
    lines are numbered from 1 as given, and the first line that is not a JSON
    object is named by that number in the error (``psycopg.errors.InvalidTextRepresentation``
    for no JSON, ``InvalidParameterValue`` for JSON that is not an object or a
    bad key). ``key_field``: each message's dedupe key is its payload's member
    of that name (absent or null: no key). Every chunk of ``chunk_size``
    lines is one statement, all of them in one transaction (the caller's, or
    one of its own): a bad line anywhere leaves nothing of the call enqueued.
    ``progress(n)`` gets the number of messages enqueued so far after each
    chunk (committed at the end).
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be positive")
    when = _when(not_before)
    ids: list[int] = []
    with conn.transaction():
        for start in range(0, len(lines), chunk_size):
            texts = list(lines[start : start + chunk_size])
            ids.extend(_send(conn, stage, texts, when, priority, None, key_field, start + 1))
            if progress is not None:
                progress(len(ids))
    return ids
