"""Read-ahead without a round trip of its own (one commit per message).

A message whose last statement runs alone in autocommit (its handler did not
use ``msg.db``) sends it as one statement with ``get_messages`` for the id
lines that arrived on stdin meanwhile (``UNION ALL``: the call's row first,
then the rows): the rows the next handlers need come back with this
message's commit, instead of costing a round trip when their turn comes. One
statement is one transaction, committed before the reply, so the message is
still answered after its commit. (A psycopg pipeline of the two statements
did the same in one round trip but cost the worker ~150 us of CPU more per
message than it saved.)

Whatever goes wrong with that statement, the transition is sent again alone
(it did not commit: the statement failed as a whole), so that its own error,
if any, is the one the message sees; the lines read ahead are then loaded
when their turn comes. A lost connection is raised as before: the runner
reconnects and redoes every unanswered line, those read ahead included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from .loading import Loaded, carries_row, load_batch
from .pipe import parse_id

__all__ = ["WITH_ROWS", "ReadAhead"]

#: ``{0}``: a ``SELECT call(...)`` returning one boolean. Its row has no id;
#: then one row per message (the columns of :data:`~.loading.GET_MESSAGES`).
WITH_ROWS = (
    "{0}, NULL::bigint, NULL::text, NULL::text, NULL::jsonb, NULL::jsonb, NULL::integer"
    " UNION ALL SELECT NULL::boolean, workqueue_id, stage, status, payload, state, retries"
    " FROM pepsi.get_messages(%s)"
)


class ReadAhead:
    """The lines read ahead of the runner's batch, and their rows once loaded.

    ``ready`` returns the complete id lines already waiting (never blocks);
    ``unanswered`` is the runner's list of lines not yet answered: lines read
    ahead are appended to it, so that a redo after a lost connection sees them.
    """

    def __init__(self, ready: Callable[[], list[bytes]], unanswered: list[bytes]) -> None:
        self._ready = ready
        self.unanswered = unanswered
        self._lines: list[bytes] = []
        self._rows: dict[int, tuple[Any, ...]] | None = None

    def send(self, conn: psycopg.Connection, query: str, params: Any) -> Any:
        """Run ``query`` (one statement, autocommit) and read ahead in the same
        round trip when lines are waiting; its first row."""
        if self._lines:  # the last read-ahead is not processed yet
            return conn.execute(query, params).fetchone()
        lines = self._ready()
        if not lines:
            return conn.execute(query, params).fetchone()
        in_hand = {parse_id(line) for line in self.unanswered}
        self.unanswered.extend(lines)
        self._lines = lines
        # A row line brings its row: only bare ids are read in this statement.
        wanted = [
            i
            for line, i in zip(lines, map(parse_id, lines), strict=True)
            if i is not None and not carries_row(line)
        ]
        if not wanted:
            self._rows = {}
            return conn.execute(query, params).fetchone()
        if in_hand.intersection(wanted):
            # A second copy of an id this worker still holds (the one in hand,
            # say): read in the same statement, its row would be the one from
            # before this transition. Load it after the commit, as before.
            return conn.execute(query, params).fetchone()
        try:
            rows = conn.execute(WITH_ROWS.format(query), (*params, wanted)).fetchall()
        except psycopg.Error:
            if conn.broken:
                raise
            return conn.execute(query, params).fetchone()  # alone: its own error, if any
        row = None
        self._rows = {}
        for r in rows:
            if r[1] is None:
                row = (r[0],)
            else:
                self._rows[r[1]] = r[1:]
        return row

    def take(self, conn: psycopg.Connection) -> list[Loaded]:
        """The lines read ahead with their rows (loaded now if that statement failed)."""
        lines, rows = self._lines, self._rows
        self._lines, self._rows = [], None
        if not lines:
            return []
        return load_batch(conn, lines, read=rows)
