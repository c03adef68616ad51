"""Loading messages: the id lines read from stdin, parsed, with their rows.

Every id already buffered is loaded in one round trip (``pepsi.get_messages``);
a second copy of an id among lines loaded together is marked :data:`RELOAD`,
to be read again at its turn (after the first copy's transition).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import psycopg

from .pipe import parse_id

__all__ = ["GET_MESSAGES", "RELOAD", "Loaded", "distinct_runs", "load_batch", "loaded_lines"]


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


def loaded_lines(lines: list[bytes], rows: dict[int, tuple[Any, ...]]) -> list[Loaded]:
    """The lines with the rows of their ids (``rows``: loaded by id); a later copy
    of an id gets :data:`RELOAD`, never the row read for the first."""
    out = []
    seen: set[int] = set()
    for line in lines:
        i = parse_id(line)
        if i is None:
            out.append(Loaded(line, None, None))
        elif i in seen:
            out.append(Loaded(line, i, RELOAD))
        else:
            seen.add(i)
            out.append(Loaded(line, i, rows.get(i)))
    return out


def distinct_runs(lines: list[bytes]) -> list[list[bytes]]:
    """The lines cut into runs in which no id comes twice (a run ends before a
    second copy), in order: each run can be loaded and committed as one batch."""
    runs: list[list[bytes]] = [[]]
    seen: set[int] = set()
    for line in lines:
        i = parse_id(line)
        if i is not None and i in seen:
            runs.append([])
            seen = set()
        if i is not None:
            seen.add(i)
        runs[-1].append(line)
    return [run for run in runs if run]


def load_batch(conn: psycopg.Connection, lines: list[bytes]) -> list[Loaded]:
    """Parse the lines and load their rows in one round trip."""
    wanted = [i for i in (parse_id(line) for line in lines) if i is not None]
    rows: dict[int, tuple[Any, ...]] = {}
    if wanted:
        rows = {row[0]: row for row in conn.execute(GET_MESSAGES, (wanted,)).fetchall()}
    return loaded_lines(lines, rows)
