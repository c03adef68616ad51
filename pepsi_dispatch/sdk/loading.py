"""Loading messages: the id lines read from stdin, parsed, with their rows.

Every id already buffered is loaded in one round trip (``pepsi.get_messages``);
a second copy of an id among lines loaded together is marked :data:`RELOAD`,
to be read again at its turn (after the first copy's transition).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import psycopg

from .adapters import Ids
from .pipe import parse_id

__all__ = [
    "GET_MESSAGES",
    "RELOAD",
    "Loaded",
    "distinct_runs",
    "load_batch",
    "loaded_lines",
    "parse_ids",
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


def load_batch(
    conn: psycopg.Connection, lines: list[bytes], ids: list[int | None] | None = None
) -> list[Loaded]:
    """Load the lines' rows in one round trip (``ids``: their :func:`parse_ids`,
    parsed here if not given)."""
    if ids is None:
        ids = parse_ids(lines)
    wanted = Ids(i for i in ids if i is not None)
    rows: dict[int, tuple[Any, ...]] = {}
    if wanted:
        rows = {row[0]: row for row in conn.execute(GET_MESSAGES, (wanted,)).fetchall()}
    return loaded_lines(lines, rows, ids)
