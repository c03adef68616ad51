"""Loading messages: the id lines read from stdin, parsed, with their rows.

Every id already buffered is loaded in one round trip (``pepsi.get_messages``);
a second copy of an id among lines loaded together is marked :data:`RELOAD`,
to be read again at its turn (after the first copy's transition).

A line may also carry its row (``CAN_TAKE_ROWS`` in pepsi_dispatch/contract.py:
the dispatcher's claim returned it, as claimed): ``ID<TAB>STAGE<TAB>RETRIES
<TAB>PAYLOAD<TAB>STATE``. Such a row is taken from the line (:func:`rows_on_lines`)
instead of the database, except after a lost connection (the row may have
moved since) and for a second copy (read after the first's transition).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import psycopg
from psycopg.adapt import Loader
from psycopg.pq import Format

from .adapters import Ids
from .pipe import parse_id

__all__ = [
    "GET_MESSAGES",
    "RELOAD",
    "Loaded",
    "carries_row",
    "distinct_runs",
    "load_batch",
    "loaded_lines",
    "parse_ids",
    "rows_on_lines",
    "split_runs",
]


class Loaded(NamedTuple):
    """An input line, the id on it (None: garbage) and its row (None: no such message)."""

    line: bytes
    message_id: int | None
    row: tuple[Any, ...] | None


#: The rows of messages by id (the columns :meth:`HandlerDispatch.process` reads).
GET_MESSAGES = (
    "SELECT workqueue_id, stage, status, payload, state, retries FROM pepsi.get_messages(%s)"
)


#: The row of a second copy of an id among lines loaded together: it was read
#: before the first copy's transition, so it must be loaded again at its turn.
RELOAD: tuple[Any, ...] = ("reload",)


def parse_ids(lines: list[bytes]) -> list[int | None]:
    """The id on each line (None: garbage), parsed once for all that follows."""
    return [parse_id(line) for line in lines]


def loaded_lines(
    lines: list[bytes], rows: dict[int, tuple[Any, ...]], ids: list[int | None] | None = None
) -> list[Loaded]:
    """The lines with the rows of their ids (``rows``: loaded by id; ``ids``: the
    lines' :func:`parse_ids`, parsed here if not given); a later copy of an id
    gets :data:`RELOAD`, never the row read for the first."""
    out = []
    seen: set[int] = set()
    for line, i in zip(lines, parse_ids(lines) if ids is None else ids, strict=True):
        if i is None:
            out.append(Loaded(line, None, None))
        elif i in seen:
            out.append(Loaded(line, i, RELOAD))
        else:
            seen.add(i)
            out.append(Loaded(line, i, rows.get(i)))
    return out


def split_runs(
    lines: list[bytes], ids: list[int | None]
) -> list[tuple[list[bytes], list[int | None]]]:
    """:func:`distinct_runs` of lines whose ids are parsed (``ids``), each run with its ids."""
    runs: list[tuple[list[bytes], list[int | None]]] = [([], [])]
    seen: set[int] = set()
    for line, i in zip(lines, ids, strict=True):
        if i is not None:
            if i in seen:
                runs.append(([], []))
                seen = set()
            seen.add(i)
        run_lines, run_ids = runs[-1]
        run_lines.append(line)
        run_ids.append(i)
    return [run for run in runs if run[0]]


def distinct_runs(lines: list[bytes]) -> list[list[bytes]]:
    """The lines cut into runs in which no id comes twice (a run ends before a
    second copy), in order: each run can be loaded and committed as one batch."""
    return [run for run, _ in split_runs(lines, parse_ids(lines))]


def _jsonb_loader(conn: psycopg.Connection) -> Loader:
    """The connection's own text jsonb loader: a row on a line decodes exactly
    as the same row read from the database would."""
    oid = conn.adapters.types["jsonb"].oid
    return conn.adapters.get_loader(oid, Format.TEXT)(oid, conn)


def carries_row(line: bytes) -> bool:
    """Is ``line`` a row line (not a bare id)?"""
    return b"\t" in line


def rows_on_lines(
    conn: psycopg.Connection, lines: list[bytes], ids: list[int | None]
) -> dict[int, tuple[Any, ...]]:
    """The rows carried by row lines (the columns of :data:`GET_MESSAGES`), by id;
    a line that is a bare id, or whose row does not parse, carries none."""
    rows: dict[int, tuple[Any, ...]] = {}
    loader: Loader | None = None
    for line, i in zip(lines, ids, strict=True):
        if i is None or i in rows or not carries_row(line):
            continue
        fields = line.split(b"\t", 4)
        if len(fields) != 5:
            continue
        if loader is None:
            if conn.info.encoding != "utf-8":
                return rows  # the dispatcher writes UTF-8: decode nothing else
            loader = _jsonb_loader(conn)
        try:
            payload = loader.load(fields[3])
            state = loader.load(fields[4])
            rows[i] = (i, fields[1].decode(), "running", payload, state, int(fields[2]))
        except (ValueError, psycopg.Error):  # a row that does not parse is read instead
            continue
    return rows


def load_batch(
    conn: psycopg.Connection,
    lines: list[bytes],
    ids: list[int | None] | None = None,
    use_lines: bool = True,
    read: dict[int, tuple[Any, ...]] | None = None,
) -> list[Loaded]:
    """The lines with their rows: taken from row lines (unless ``use_lines`` is
    false), then from ``read`` (rows already read, by id), the others loaded in
    one round trip (``ids``: the lines' :func:`parse_ids`, parsed here if not
    given)."""
    if ids is None:
        ids = parse_ids(lines)
    rows = rows_on_lines(conn, lines, ids) if use_lines else {}
    if read:
        rows.update(read)
    wanted = Ids(i for i in ids if i is not None and i not in rows)
    if wanted:
        rows.update((row[0], row) for row in conn.execute(GET_MESSAGES, (wanted,)).fetchall())
    return loaded_lines(lines, rows, ids)
