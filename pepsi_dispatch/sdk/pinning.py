"""The check before a handler starts: is the row still ours?

A worker is handed ids by its dispatcher; the fencing token (the dispatcher id)
refuses a late *write* once the row is no longer held by that dispatcher. The
*start* needs the same guard: a worker that was frozen (SIGSTOP, a suspended
host) while a competing replica declared its dispatcher dead, reset its rows
and ran them, would otherwise resume, read the next id on its pipe and run the
handler again, side effects outside the database and all.

So, with a dispatcher id, each group commit batch (and each message, one
commit per message) begins its transaction with ``pepsi.pin_messages``: one
pipeline, ``BEGIN`` and the call, that loads the rows and locks, for the
transaction, every one still ``running`` under our dispatcher. A row so locked
cannot be reset by another replica before we commit; a row that is not (reset,
released, held by another dispatcher) is not started: it is answered
``1 ...`` (:meth:`Pin.taken_over`), which the dispatcher, if it still lives,
records with a write fenced by the same token -- a no-op on a row it no longer
holds -- and then forgets the id.

The pin replaces the batch's load: the rows it returns are current, so rows on
the id lines and rows read ahead with the last commit are not used.
"""

from __future__ import annotations

from typing import Any

import psycopg

from .adapters import Ids

__all__ = ["PIN_MESSAGES", "PIN_SIGNATURE", "Pin", "PinnedRows"]

#: The rows of ``ids`` (the columns of :data:`~.loading.GET_MESSAGES`, then the
#: holder), the ones still running under the dispatcher locked FOR NO KEY UPDATE.
PIN_MESSAGES = (
    "SELECT workqueue_id, stage, status, payload, state, retries, held_by"
    " FROM pepsi.pin_messages(%s, %s::bigint)"
)
#: Since the migration that added it; a worker on an older database starts
#: messages unchecked, as before (and says so once).
PIN_SIGNATURE = "pepsi.pin_messages(bigint[], bigint)"

#: id -> (the row as :data:`~.loading.GET_MESSAGES` gives it, its holder)
PinnedRows = dict[int, tuple[tuple[Any, ...], int | None]]


class Pin:
    """Pins the rows of the messages about to start, for one dispatcher."""

    def __init__(self, dispatcher_id: int, stage: str) -> None:
        self.dispatcher_id = dispatcher_id
        self.stage = stage

    def begin(self, conn: psycopg.Connection, ids: list[int]) -> PinnedRows:
        """``BEGIN`` and ``pin_messages(ids)`` in one round trip; the rows by id.

        The transaction stays open: the caller runs the handlers and the
        transitions in it and commits (or rolls back, which ends the pin).
        On an error the transaction is rolled back (unless the connection is
        gone) and the error raised.
        """
        try:
            with conn.pipeline():
                cur = self.send(conn, ids)
            return self.rows(cur)
        except psycopg.Error:
            if (
                not conn.broken
                and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
            ):
                conn.execute("ROLLBACK")
            raise

    def send(self, conn: psycopg.Connection, ids: list[int]) -> psycopg.Cursor[Any]:
        """Queue ``BEGIN`` and the pin (in the caller's pipeline); read it with :meth:`rows`."""
        conn.execute("BEGIN")
        return conn.execute(PIN_MESSAGES, (Ids(ids), self.dispatcher_id))

    @staticmethod
    def rows(cur: psycopg.Cursor[Any]) -> PinnedRows:
        """What the pin returned: each row (as get_messages gives it) and its holder, by id."""
        return {r[0]: (r[:6], r[6]) for r in cur.fetchall()}

    def startable(self, row: tuple[Any, ...] | None, holder: int | None) -> bool:
        """May the handler start? False only for a row running at our stage
        under another dispatcher, or none: every other refusal (no such row, not
        running, another stage) is :meth:`HandlerDispatch.process`'s to answer."""
        if row is None or row[2] != "running" or row[1] != self.stage:
            return True
        return holder == self.dispatcher_id

    def taken_over(self, message_id: int, holder: int | None) -> str:
        """The answer for a message whose row is no longer ours: not started."""
        now = f"dispatcher {holder}" if holder is not None else "no dispatcher"
        reason = (
            f"message {message_id} is no longer held by dispatcher {self.dispatcher_id}"
            f" (it is running at stage {self.stage} under {now}); not started"
        )
        return f"1 {reason}"
