"""Python API to put messages into the queue (ingress).

    from pepsi_dispatch.enqueue import connect, enqueue, enqueue_many

    with connect() as conn:                      # PEPSI_DSN, else the configuration's DSN
        one = enqueue(conn, "fetch", {"url": "https://example.org/"})
        ids = enqueue_many(conn, "fetch", [{"n": i} for i in range(10_000)])

Each call is one statement (``pepsi.enqueue`` / ``pepsi.enqueue_lines``) or one
COPY, so a bulk insert is one notification to the dispatcher. ``enqueue_many``
sends large lists in chunks (one commit per chunk, unless the caller's
connection is inside a transaction); ``enqueue_lines`` does the same for JSON
texts the caller already has (JSON lines), all chunks in one transaction. A
payload is a JSON object (a ``dict``; None means ``{}``); anything else raises
``ValueError`` before the database is asked.

How a chunk travels: on an autocommit connection outside a transaction, for a
call without ``not_before``, as a ``COPY`` into ``pepsi.workqueue (stage,
priority, payload)`` (producers
may insert those columns and ``dedupe_key``; the table refuses a bad stage
name, a payload that is not an object, a malformed key, and a key a live
message holds), streamed while it is built, its ids read with
``pepsi.copy_mark()`` and ``pepsi.copied_ids()``: as fast as a bare COPY.
``enqueue_many``'s keys go in the same COPY, each once per chunk (a repeat
answers with the first's id); a chunk with a held key is refused whole, and
the call's later chunks ask ``pepsi.key_holders()`` first. So do
``enqueue_lines``' keys from ``key_field`` when Python reads them exactly as
the database would (each chunk's lines parsed in one ``json.loads``; every
key absent, null or a string; the lines themselves copied as read, and the
ones a repeated or held key leaves out parsed by the database all the
same); a chunk with a held key rolls the call back, which is copied again
with its keys looked up first. Otherwise, or when
the COPY is refused (a bad line, a held key, no privilege, an older schema),
as one ``text[]`` of JSON texts through ``pepsi.enqueue_lines``, which
parses, checks and inserts them in one set-based statement, answers held
keys with their holders' ids, and names the first bad line.

Give each thread its own connection. psycopg shares one transaction per
connection, and the COPY path runs each chunk in a transaction block. On a
connection shared by threads, bulk calls run one chunk (``enqueue_many``) or
one call (``enqueue_lines``) at a time, and a statement another thread runs
meanwhile joins the chunk's transaction: it commits with the chunk and is
not taken for the chunk's rows, but a chunk that fails (a bad line) rolls it
back too, and one that inserts as many rows as the chunk at that moment
leaves the chunk's ids unknown (``AmbiguousIdsError``, raised once all is
committed). A transaction block another thread opens meanwhile breaks
psycopg's own tracking of blocks (``OutOfOrderTransactionNesting``); a
chunk that ended inside another thread's transaction raises
``SharedTransactionError`` rather than return ids of rows it did not commit.

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
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any

import psycopg
from psycopg.pq import PipelineStatus, TransactionStatus
from psycopg.types.json import Jsonb

__all__ = [
    "DEFAULT_CHUNK",
    "AmbiguousIdsError",
    "SharedTransactionError",
    "connect",
    "enqueue",
    "enqueue_lines",
    "enqueue_many",
    "is_blank",
    "resolve_dsn",
]

#: Payloads per ``pepsi.enqueue_lines`` statement (measured: 10,000 to 50,000
#: cost the same per row; docs/BENCHMARKS.md, *Bulk enqueue*).
DEFAULT_CHUNK = 20_000

_LINES_SQL = "SELECT pepsi.enqueue_lines(%s, %b::text[], %s, %s::int, %b::text[], %s, %s::bigint)"

#: The COPY path's statement. CSV with separator 0x02 and quote 0x01: JSON text
#: never holds a raw control character, so each line goes through as it is (no
#: escaping), the payload last on its row.
_COPY_SQL = (
    "COPY pepsi.workqueue (stage, priority, payload) FROM STDIN"
    " (FORMAT csv, DELIMITER E'\\x02', QUOTE E'\\x01')"
)
#: The keyed COPY path's statement (enqueue_many with dedupe keys): the same, the
#: key after the payload (an empty field is NULL: no key).
_COPY_KEYED_SQL = (
    "COPY pepsi.workqueue (stage, priority, payload, dedupe_key) FROM STDIN"
    " (FORMAT csv, DELIMITER E'\\x02', QUOTE E'\\x01')"
)
#: A key that cannot travel raw in that COPY (the statement path takes it).
_NOT_COPYABLE_KEY = re.compile("[\x00-\x02\n\r]")
#: What a line must not hold to travel raw in that COPY (after CR LF became LF).
_NOT_COPYABLE = ("\x00", "\x01", "\x02", "\r")
#: A line whose JSON cannot be an object: its first character that is not a
#: blank is not ``{``. (One that is, and parses, is an object: the server
#: parses every line; the table's trigger checks only other roles' rows.)
_NOT_AN_OBJECT = re.compile("^[ \t]*[^{ \t]", re.MULTILINE)
#: A lone surrogate, which no UTF-8 text (and no jsonb string) can hold.
_SURROGATE = re.compile("[\ud800-\udfff]")
#: The lines a keyed COPY skips (a repeated key, a held key), parsed by the
#: database all the same: true when every one is a JSON object (a line that is
#: not JSON raises 22P02).
_ALL_OBJECTS_SQL = (
    "SELECT bool_and(jsonb_typeof(t.l::jsonb) = 'object') FROM unnest(%s::text[]) AS t(l)"
)
#: A stage name as the table's CHECK takes it (anything else: enqueue_lines says why).
_STAGE_NAME = re.compile("[A-Za-z0-9_.-]+")
#: Lines per write into the COPY: the server parses one while the next is built.
_COPY_BATCH = 1_000
#: What a line the COPY's jsonb parse refuses raises besides a DataError: one
#: too large (54000) or nested too deeply (54001) for jsonb.
_LINE_TOO_BIG = (psycopg.errors.ProgramLimitExceeded, psycopg.errors.StatementTooComplex)
#: Errors after which a chunk goes through pepsi.enqueue_lines instead: a bad
#: line (that function names it), no INSERT privilege, a schema before 0041.
_COPY_REFUSALS = (
    psycopg.errors.DataError,
    psycopg.errors.IntegrityError,
    *_LINE_TOO_BIG,
    psycopg.errors.InsufficientPrivilege,
    psycopg.errors.UndefinedFunction,
)
#: The refusals that come from a line (pepsi.enqueue_lines names it).
_BY_LINE = (psycopg.errors.DataError, psycopg.errors.IntegrityError, *_LINE_TOO_BIG)
#: Errors after which a keyed chunk goes through pepsi.enqueue_lines instead:
#: those, and a deadlock with a producer inserting the same keys in another
#: order. (A key a concurrent producer took after the look-up is 23505, an
#: IntegrityError: enqueue_lines answers it with that producer's id.)
_KEYED_COPY_REFUSALS = (*_COPY_REFUSALS, psycopg.errors.DeadlockDetected)
#: Connections whose role or schema refused the COPY path once (not asked again).
_no_copy: weakref.WeakSet[psycopg.Connection] = weakref.WeakSet()
#: Connections whose role or schema refused the keyed COPY path once (a schema
#: before 0042, or no INSERT on dedupe_key): their keyed calls take statements.
_no_keyed_copy: weakref.WeakSet[psycopg.Connection] = weakref.WeakSet()
#: One lock per connection: the bulk calls of threads sharing it run one at a
#: time (two transaction blocks at once on one connection nest, and psycopg then
#: loses track of the open transaction).
_bulk_locks: weakref.WeakKeyDictionary[psycopg.Connection, threading.RLock] = (
    weakref.WeakKeyDictionary()
)
_bulk_locks_guard = threading.Lock()


def _bulk_lock(conn: psycopg.Connection) -> threading.RLock:
    with _bulk_locks_guard:
        lock = _bulk_locks.get(conn)
        if lock is None:
            lock = _bulk_locks[conn] = threading.RLock()
        return lock


def _sync_connection(conn: object) -> None:
    if not isinstance(conn, psycopg.Connection):
        raise TypeError(
            f"a psycopg.Connection is needed, not {type(conn).__name__} (an AsyncConnection:"
            " call these functions in a thread with a Connection of their own)"
        )


class SharedTransactionError(RuntimeError):
    """Another thread opened a transaction on this connection during the call:
    the call's last rows are in that transaction, and commit or roll back with
    it; their ids are not returned. Give each thread its own connection."""


def _committed(tx: psycopg.Transaction) -> None:
    """After the call's own transaction block: raise unless it was the main
    transaction (a block that found another thread's transaction open became
    a savepoint inside it, and committed nothing)."""
    if tx.savepoint_name:  # "" (or None) for the main transaction
        raise SharedTransactionError(
            "another thread opened a transaction on this connection during the call; the"
            " call's last rows commit or roll back with it (give each thread its own connection)"
        )


class _CopyRefused(Exception):
    """The COPY path cannot take these lines; pepsi.enqueue_lines will.

    ``chunk_start``: the first line of the chunk the database refused (None:
    refused before the database saw a line, or for a reason no line causes).
    """

    def __init__(self, reason: str, chunk_start: int | None = None) -> None:
        super().__init__(reason)
        self.chunk_start = chunk_start


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


def _not_an_object(what: str, payload: Any) -> ValueError:
    return ValueError(f"{what} must be a JSON object (a dict), not {type(payload).__name__}")


def _payload(payload: Any, what: str = "payload") -> Jsonb:
    if payload is None:
        return Jsonb({})
    if not isinstance(payload, dict):
        raise _not_an_object(what, payload)
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


def _copy_possible(conn: psycopg.Connection) -> bool:
    """True when this call may COPY: it owns the transaction (so the rows' xmin
    is that transaction's), not in pipeline mode (no COPY there), and the
    connection did not refuse before."""
    return (
        conn.autocommit
        and conn.info.transaction_status == TransactionStatus.IDLE
        and conn.pgconn.pipeline_status == PipelineStatus.OFF
        and conn not in _no_copy
    )


def is_blank(line: str | None) -> bool:
    """A blank JSON line: empty or only ASCII whitespace (skipped, no message).

    Narrower than Python's ``str.isspace``: a line of other whitespace (U+00A0,
    0x1F, ...) goes to the database, which decides as ``pepsi.enqueue_lines``
    does (in the database's locale). A line that starts with ``{`` (nearly
    every one) is told at once.
    """
    return not line or (line[0] != "{" and not line.strip(" \t\n\r\x0b\x0c"))


def _without_blanks(lines: Sequence[str]) -> list[str]:
    """``lines`` but the blank ones."""
    return [t for t in lines if not is_blank(t)]


def _copy(
    conn: psycopg.Connection, stage: str, batches: Iterable[Sequence[str]], priority: int
) -> list[int] | None:
    """COPY the texts of ``batches`` (JSON objects; blank lines are skipped)
    inside the caller's transaction, each batch written as soon as it is built;
    their ids.

    None (the rows are in, to be committed): another statement of this
    transaction inserted as many rows meanwhile (another thread on this
    connection), so the COPY's ids cannot be told from its. Raises
    _CopyRefused (or one of _COPY_REFUSALS) when the lines cannot go this
    way; the caller's transaction is then to be rolled back.
    """
    mark = _copy_mark(conn, stage)
    prefix = f"{stage}\x02{int(priority)}\x02"
    glue = "\n" + prefix
    sent = 0
    with conn.cursor().copy(_COPY_SQL) as cp:
        for lines in batches:
            try:
                body = "\n".join(lines)
                starts = body.count("\n{") + (body[:1] == "{")  # lines that start with {
            except TypeError:
                starts = -1  # a None line (blank)
            batch = lines
            if starts != len(lines):  # some may be blank: each line is looked at
                batch = _without_blanks(lines)
                body = "\n".join(batch)
            if not batch:
                continue
            sent += len(batch)
            if body.count("\n") != len(batch) - 1:
                raise _CopyRefused("a line holds a line break")
            if "\r" in body:
                body = body.replace("\r\n", "\n").removesuffix("\r")
            if any(c in body for c in _NOT_COPYABLE):  # a substring search each: fast
                raise _CopyRefused("a line holds a control character")
            if starts != len(lines) and _NOT_AN_OBJECT.search(body):
                raise _CopyRefused("a line is not a JSON object")
            cp.write(prefix + body.replace("\n", glue) + "\n")
    return _copied_ids(conn, mark, sent)


def _copy_mark(conn: psycopg.Connection, stage: str) -> int:
    """Before a COPY: the last id drawn. Raises _CopyRefused when the COPY
    cannot go (a bad stage name: enqueue_lines says why; a sequence that
    caches ids ahead, whose ids cannot be read off it)."""
    if not _STAGE_NAME.fullmatch(stage):
        raise _CopyRefused("not a stage name")
    row = conn.execute("SELECT pepsi.copy_mark()").fetchone()
    mark = row[0] if row else None
    if mark is None:
        _no_copy.add(conn)
        raise _CopyRefused("ids are cached ahead")
    return int(mark)


def _copied_ids(conn: psycopg.Connection, mark: int, sent: int) -> list[int] | None:
    """After a COPY of ``sent`` rows that began at id ``mark``: their ids in
    row order, or None when another statement of this transaction inserted as
    many rows meanwhile."""
    if sent == 0:
        return []  # (copied_ids would look for a statement of no rows)
    row = conn.execute("SELECT pepsi.copy_mark()").fetchone()
    last = row[0] if row else None
    if last is not None and last - mark == sent:
        return list(range(mark + 1, last + 1))  # nobody drew ids meanwhile: ours, in order
    row = conn.execute("SELECT pepsi.copied_ids(%s, %s)", (mark, sent)).fetchone()
    return None if row is None or row[0] is None else list(row[0])


def _keys_copyable(conn: psycopg.Connection, keys: Sequence[str | None]) -> bool:
    """May this chunk's keys take the keyed COPY? Each None or a string the
    database takes as it is (1 to 512 bytes, no line break or 0x00-0x02, and
    not only whitespace by Python's measure, which counts every character the
    database's locale may count, and more); any other goes through
    enqueue_lines, which decides and names a bad one. (The table's trigger
    checks keys too, but not the owner's.)"""
    if conn in _no_keyed_copy:
        return False
    present = [k for k in keys if k is not None]
    if not all(type(k) is str for k in present):
        return False
    if _NOT_COPYABLE_KEY.search("".join(present)):
        return False
    return all((len(k) <= 128 or len(k.encode()) <= 512) and k and not k.isspace() for k in present)


def _copy_keyed(
    conn: psycopg.Connection,
    stage: str,
    chunk: list[Any],
    keys: Sequence[str | None],
    first: int,
    priority: int,
    held: Mapping[str, int],
    texts: Sequence[str] | None = None,
) -> list[int] | None:
    """COPY the payloads of ``chunk`` (or their ``texts`` as read, if given) with
    their ``keys`` in the caller's transaction; one id each, as enqueue_lines.

    Of the payloads that share a key, the first is inserted and the others
    answer with its id. ``held``: keys known to be held (looked up with
    :func:`_key_holders`, or taken by an earlier chunk) -> the holder's id;
    their payloads are not inserted and answer with it. Any other key is
    assumed free (a bulk load of new keys pays no look-up): one that is held
    (or that a concurrent producer takes meanwhile) makes the unique index
    refuse the COPY (``UniqueViolation``), and the caller takes another way
    (enqueue_lines answers with the holder's id). None as :func:`_copy`.
    """
    for i, p in enumerate(chunk, first):  # every payload, inserted or not
        if p is not None and not isinstance(p, dict):
            raise _not_an_object(f"payload {i}", p)
    mark = _copy_mark(conn, stage)
    inserted: list[int] = []  # the lines COPY inserts, in order
    inserter: dict[str, int] = {}  # key -> the line that inserts it
    for i, k in enumerate(keys):
        if k is None:
            inserted.append(i)
        elif k not in held and k not in inserter:
            inserter[k] = i
            inserted.append(i)
    if texts is not None and len(inserted) < len(texts):
        _check_skipped(conn, texts, inserted)
    prefix = f"{stage}\x02{int(priority)}\x02"
    with conn.cursor().copy(_COPY_KEYED_SQL) as cp:
        for start in range(0, len(inserted), _COPY_BATCH):  # built while the server parses
            cp.write(
                "".join(
                    f"{prefix}{_dumps(chunk[i] or {}) if texts is None else texts[i]}"
                    f"\x02{keys[i] or ''}\n"
                    for i in inserted[start : start + _COPY_BATCH]
                )
            )
    got = _copied_ids(conn, mark, len(inserted))
    if got is None:
        return None
    line_id = dict(zip(inserted, got, strict=True))
    return [
        line_id[i] if k is None else held[k] if k in held else line_id[inserter[k]]
        for i, k in enumerate(keys)
    ]


def _key_holders(conn: psycopg.Connection, keys: Sequence[str | None]) -> dict[str, int]:
    """Which of ``keys`` live messages hold: key -> the holder's id."""
    wanted = list({k for k in keys if k is not None})
    if not wanted:
        return {}
    cur = conn.execute(
        "SELECT dedupe_key, workqueue_id FROM pepsi.key_holders(%s::text[])", (wanted,)
    )
    return {k: int(i) for k, i in cur.fetchall()}


def _check_skipped(conn: psycopg.Connection, texts: Sequence[str], inserted: list[int]) -> None:
    """Have the database parse the lines a keyed COPY leaves out (as
    pepsi.enqueue_lines parses every line): raises _CopyRefused, or 22P02,
    when one is not a JSON object."""
    copied = set(inserted)
    skipped = [t for i, t in enumerate(texts) if i not in copied]
    row = conn.execute(_ALL_OBJECTS_SQL, (skipped,)).fetchone()
    if not (row and row[0]):
        raise _CopyRefused("a line the COPY leaves out is not a JSON object")


class AmbiguousIdsError(RuntimeError):
    """The messages were enqueued (committed), but the ids of some cannot be
    told: another thread ran a statement on this connection inside the call's
    transaction that inserted as many rows at the same time. Share a
    connection between threads only when no call is running on it, or give
    each thread its own."""


def _ambiguous_lines(known: int) -> AmbiguousIdsError:
    return AmbiguousIdsError(
        f"all lines were enqueued, {known} with known ids; the ids of the others cannot"
        " be told from those of another thread's statement on this connection (give each"
        " thread its own connection)"
    )


def _refused(conn: psycopg.Connection, exc: BaseException | None, keyed: bool = False) -> None:
    """Remember a connection whose role or schema cannot COPY (``keyed``: cannot
    COPY keys; it may still COPY without)."""
    if isinstance(exc, psycopg.errors.InsufficientPrivilege | psycopg.errors.UndefinedFunction):
        (_no_keyed_copy if keyed else _no_copy).add(conn)


_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _dumped(chunk: list[Any], first: int) -> Iterator[list[str]]:
    """The payloads of ``chunk`` (numbered from ``first``) as JSON texts, a batch at a time."""
    for start in range(0, len(chunk), _COPY_BATCH):
        batch = []
        for i, p in enumerate(chunk[start : start + _COPY_BATCH], first + start):
            if p is None:
                p = {}
            elif not isinstance(p, dict):
                raise _not_an_object(f"payload {i}", p)
            batch.append(_dumps(p))
        yield batch


class _ChunkCopier:
    """enqueue_many's COPY path, one chunk at a time, with what one chunk
    teaches the next: a chunk that met a held key has the later chunks look
    their keys up first; ids that could not be told apart are remembered."""

    def __init__(self, conn: psycopg.Connection, stage: str, priority: int) -> None:
        self.conn = conn
        self.stage = stage
        self.priority = priority
        #: look keys up before the COPY (a chunk met a held key)
        self.look_up = False
        #: a chunk's ids could not be told from another thread's rows
        self.ambiguous = False

    def copy(self, chunk: list[Any], keys: list[str | None] | None, first: int) -> list[int] | None:
        """The chunk's ids once committed by COPY ([] when ambiguous), or None
        when it must go through pepsi.enqueue_lines (rolled back, or never
        tried: no COPY possible on this connection, or keys it cannot take)."""
        conn = self.conn
        if not _copy_possible(conn) or (keys is not None and not _keys_copyable(conn, keys)):
            return None
        try:
            with conn.transaction() as tx:
                if keys is None:
                    got = _copy(conn, self.stage, _dumped(chunk, first), self.priority)
                else:
                    held = _key_holders(conn, keys) if self.look_up else {}
                    got = _copy_keyed(conn, self.stage, chunk, keys, first, self.priority, held)
            _committed(tx)
        except (_CopyRefused, *_KEYED_COPY_REFUSALS) as exc:
            _refused(conn, exc, keyed=keys is not None)  # rolled back
            self.look_up |= isinstance(exc, psycopg.errors.UniqueViolation)
            return None
        if got is None:
            self.ambiguous = True
            return []
        return got


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
    _sync_connection(conn)
    if chunk_size < 1:
        raise ValueError("chunk_size must be positive")
    when = _when(not_before)
    ids: list[int] = []
    done = 0
    keys = None if dedupe_keys is None else list(dedupe_keys)
    copier = _ChunkCopier(conn, stage, priority)
    for chunk in _chunks(payloads, chunk_size):
        part = None if keys is None else keys[done : done + len(chunk)]
        if part is not None and len(part) != len(chunk):
            raise ValueError("dedupe_keys must have one element per payload")
        with _bulk_lock(conn):  # per chunk: payloads and progress run outside it
            got = copier.copy(chunk, part, done + 1) if when is None else None
            if got is None:
                texts = [t for batch in _dumped(chunk, done + 1) for t in batch]
                got = _send(conn, stage, texts, when, priority, part, None, done + 1)
        ids.extend(got)
        done += len(chunk)
        if progress is not None:
            progress(done)
    if keys is not None and len(keys) != done:
        raise ValueError("dedupe_keys must have one element per payload")
    if copier.ambiguous:
        raise AmbiguousIdsError(
            f"all {done} messages were enqueued, but the ids of some cannot be told from those"
            " of another thread's statement on this connection (give each thread its own"
            " connection)"
        )
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
    lines is one COPY or one statement, all of them in one transaction (the
    caller's, or one of its own): a bad line anywhere leaves nothing of the
    call enqueued. ``progress(n)`` gets the number of messages enqueued so far
    after each chunk (committed at the end).
    """
    _sync_connection(conn)
    if chunk_size < 1:
        raise ValueError("chunk_size must be positive")
    with _bulk_lock(conn):  # the whole call: it is one transaction
        return _enqueue_lines(
            conn,
            stage,
            lines,
            chunk_size,
            _when(not_before),
            priority,
            key_field,
            _Progress(progress),
        )


def _enqueue_lines(
    conn: psycopg.Connection,
    stage: str,
    lines: Sequence[str],
    chunk_size: int,
    when: datetime | None,
    priority: int,
    key_field: str | None,
    report: _Progress,
) -> list[int]:
    """enqueue_lines under the connection's bulk lock: by COPY, else by statements."""
    if key_field is None and when is None and _copy_possible(conn):
        try:
            return _copy_lines(conn, stage, lines, chunk_size, priority, report)
        except _CopyRefused as exc:
            # Rolled back. A chunk the COPY refused goes to pepsi.enqueue_lines
            # alone first: a bad line there is named at once (and raised).
            _refused(conn, exc.__cause__)
            if exc.chunk_start is not None:
                with conn.transaction():
                    start = exc.chunk_start
                    texts = list(lines[start : start + chunk_size])
                    _send(conn, stage, texts, when, priority, None, None, start + 1)
                    raise psycopg.Rollback from None
    if type(key_field) is str and "\x00" not in key_field and when is None and _copy_possible(conn):
        got = _copy_keyed_lines(conn, stage, lines, chunk_size, priority, key_field, report)
        if got is not None:
            return got
    ids: list[int] = []
    with conn.transaction():
        for start in range(0, len(lines), chunk_size):
            texts = list(lines[start : start + chunk_size])
            ids.extend(_send(conn, stage, texts, when, priority, None, key_field, start + 1))
            report(len(ids))
    return ids


def _field_keys(
    texts: list[str], key_field: str
) -> tuple[list[Any], list[str | None], list[str]] | None:
    """The JSON objects of ``texts`` (no blank one), each one's ``key_field``,
    and the texts as they go raw into the COPY (a CR of CR LF dropped), when
    Python tells the keys exactly as the database's ``->>`` would and the texts
    can travel raw: no line break or character 0x00-0x02 in them, every text
    parses (all in one call: at C speed), is an object, and has no key or
    null, or a string. None otherwise (the database parses and names)."""
    joined = ",".join(texts)  # one pass for the checks and the parse
    if "\n" in joined:
        return None
    if "\r" in joined:
        texts = [t.removesuffix("\r") for t in texts]
        joined = ",".join(texts)
    if any(c in joined for c in _NOT_COPYABLE):
        return None
    try:
        docs = json.loads("[" + joined + "]")
    except (ValueError, RecursionError):
        return None
    if len(docs) != len(texts):
        return None  # a text held more than one value (a comma)
    keys: list[str | None] = []
    for doc in docs:
        if type(doc) is not dict:
            return None
        key = doc.get(key_field)
        if key is not None and type(key) is not str:
            return None  # a number, an object: the database's text of it decides
        if key is not None and not key.isascii() and _SURROGATE.search(key):
            return None  # from a \uD800 escape, which the database refuses
        keys.append(key)
    return docs, keys, texts


def _copy_keyed_lines(
    conn: psycopg.Connection,
    stage: str,
    lines: Sequence[str],
    chunk_size: int,
    priority: int,
    key_field: str,
    report: _Progress,
) -> list[int] | None:
    """enqueue_lines with ``key_field`` by the keyed COPY, the keys read in
    Python; None when the COPY was refused (rolled back: the call then goes
    through statements, which answer held keys and name a bad line).

    Optimistic first: a key an earlier chunk of the call took is answered
    from what the call knows, but one a live message holds makes the COPY
    refuse (23505), and the call is copied again with each chunk's keys
    looked up first. The COPY runs in the call's own
    transaction, never under a savepoint: its ids are read off the rows that
    transaction wrote."""
    look_up = False
    while True:
        try:
            return _copy_keyed_chunks(
                conn, stage, lines, chunk_size, priority, key_field, look_up, report
            )
        except (_CopyRefused, *_KEYED_COPY_REFUSALS) as exc:
            _refused(conn, exc, keyed=True)  # rolled back
            if look_up or not isinstance(exc, psycopg.errors.UniqueViolation):
                return None
            look_up = True


def _copy_keyed_chunks(
    conn: psycopg.Connection,
    stage: str,
    lines: Sequence[str],
    chunk_size: int,
    priority: int,
    key_field: str,
    look_up: bool,
    report: _Progress,
) -> list[int]:
    """One attempt of :func:`_copy_keyed_lines`, all chunks in one transaction:
    each by the keyed COPY, or by pepsi.enqueue_lines when Python cannot read
    its keys exactly as the database would."""
    ids: list[int] = []
    ambiguous = False
    taken: dict[str, int] = {}  # keys the call's earlier chunks inserted (or met held)
    with conn.transaction() as tx:
        for start in range(0, len(lines), chunk_size):
            chunk = lines[start : start + chunk_size]
            texts = _without_blanks(chunk)
            parsed = _field_keys(texts, key_field) if texts else None
            if parsed is None or not _keys_copyable(conn, parsed[1]):
                got = _send(conn, stage, list(chunk), None, priority, None, key_field, start + 1)
            else:
                docs, keys, raw = parsed
                held = {k: taken[k] for k in keys if k in taken}
                if look_up:
                    held.update(_key_holders(conn, [k for k in keys if k not in taken]))
                copied = _copy_keyed(conn, stage, docs, keys, start + 1, priority, held, raw)
                ambiguous |= copied is None
                got = copied or []
                for k, i in zip(keys, got, strict=False):  # none when ambiguous
                    if k is not None:
                        taken.setdefault(k, i)
            ids.extend(got)
            report(len(ids))
    _committed(tx)
    if ambiguous:
        raise _ambiguous_lines(len(ids))
    return ids


class _Progress:
    """A progress callback that never goes back: after the COPY path gave up,
    the other path reports only counts beyond what was already shown."""

    def __init__(self, callback: Callable[[int], None] | None) -> None:
        self.callback = callback
        self.shown = -1

    def __call__(self, done: int) -> None:
        if self.callback is not None and done > self.shown:
            self.shown = done
            self.callback(done)


def _copy_lines(
    conn: psycopg.Connection,
    stage: str,
    lines: Sequence[str],
    chunk_size: int,
    priority: int,
    report: _Progress,
) -> list[int]:
    """enqueue_lines through COPY: every chunk in one transaction; blank lines skipped.

    Raises _CopyRefused, with the first line of the refused chunk when the
    database refused one.
    """
    ids: list[int] = []
    ambiguous = False
    with conn.transaction() as tx:
        for start in range(0, len(lines), chunk_size):
            chunk = lines[start : start + chunk_size]
            batches = (chunk[b : b + _COPY_BATCH] for b in range(0, len(chunk), _COPY_BATCH))
            try:
                got = _copy(conn, stage, batches, priority)
            except _COPY_REFUSALS as exc:
                by_line = isinstance(exc, _BY_LINE)
                raise _CopyRefused(str(exc), chunk_start=start if by_line else None) from exc
            if got is None:
                ambiguous = True
            else:
                ids.extend(got)
            report(len(ids))
    _committed(tx)
    if ambiguous:
        raise _ambiguous_lines(len(ids))
    return ids
