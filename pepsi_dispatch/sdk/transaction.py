"""Transaction scopes of messages, and group commit's deferred statements.

Outside group commit (:attr:`CommitMode.PER_MESSAGE`) a message's first level
is a real transaction (BEGIN); a message whose handler never touches
``msg.db`` and that needs a single statement runs it without any explicit
transaction (one round trip, one commit). In group commit
(:attr:`CommitMode.GROUP`) the batch is one transaction and every level of a
message is a savepoint of it; the statements of a message without a
savepoint of its own are deferred and sent, for the whole batch, in one
pipeline before the commit (:class:`GroupBatch`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Any, NamedTuple

import psycopg

from .adapters import Ids
from .ahead import ReadAhead
from .loading import GET_MESSAGES
from .pinning import Pin, PinnedRows
from .pipe import exc_reason
from .statements import ADVANCE_MANY, FINISH_MANY, MANY, SINGLE, Statement

__all__ = [
    "BatchFailed",
    "CallMode",
    "CommitMode",
    "Deferred",
    "GroupBatch",
    "HandlerScope",
    "Role",
    "RowLost",
    "SET_BASED",
    "Scope",
    "TransactionEnded",
    "call_mode",
    "plan_flush",
]


class RowLost(Exception):
    """A transition changed nothing: the row is no longer ours."""


class BatchFailed(BaseException):
    """The group commit transaction failed beyond repair: roll back, answer nothing, exit 1.

    A BaseException so that a handler's ``except Exception`` cannot swallow it.
    """


class TransactionEnded(BaseException):
    """A handler ended the transaction its message runs in (``COMMIT`` or
    ``ROLLBACK`` executed on ``msg.db``): the message's levels, and in group
    commit the batch's transaction, are gone. ``answer`` is the message's, once
    it is failed.

    A BaseException, raised by the SDK after the handler returned, so that
    nothing treats it as the handler's own failure.
    """

    def __init__(self, answer: str | None = None) -> None:
        super().__init__(answer)
        self.answer = answer


#: What the errors of a savepoint or transaction that is not there anymore say:
#: a handler's ``COMMIT AND CHAIN`` (or ``COMMIT; BEGIN``) left a transaction
#: open, without the savepoints of the one it ended.
GONE_ERRORS = (psycopg.errors.InvalidSavepointSpecification, psycopg.errors.NoActiveSqlTransaction)

_IDLE = psycopg.pq.TransactionStatus.IDLE


@contextlib.contextmanager
def _quietly() -> Iterator[None]:
    """psycopg warns when a level's rollback fails; a level whose savepoint a
    handler's COMMIT or ROLLBACK took away is expected to."""
    log = logging.getLogger("psycopg.transaction")
    disabled, log.disabled = log.disabled, True
    try:
        yield
    finally:
        log.disabled = disabled


class CommitMode(Enum):
    """How messages are committed."""

    PER_MESSAGE = "a transaction (or none) per message, committed before its answer"
    GROUP = "one transaction for the batch, a savepoint per message, one commit"


class Role(Enum):
    """Where a statement stands in its message's statements."""

    STEP = "more statements of the message follow (set_state, hop)"
    LAST = "the message's transition, its last statement"


class CallMode(Enum):
    """How one statement is sent."""

    AUTOCOMMIT = "alone, outside any transaction: one round trip, its own commit"
    IN_TRANSACTION = "in the message's transaction or savepoint, opened first if need be"
    DEFERRED = "queued for the group commit batch's pipeline"


def call_mode(commit: CommitMode, depth: int, role: Role) -> CallMode:
    """How a statement of ``role`` is sent when the message has ``depth`` levels open."""
    if commit is CommitMode.GROUP:
        return CallMode.DEFERRED if depth == 0 else CallMode.IN_TRANSACTION
    if role is Role.LAST and depth == 0:
        return CallMode.AUTOCOMMIT
    return CallMode.IN_TRANSACTION


class Deferred(NamedTuple):
    """A statement waiting for the batch's pipeline; ``slot``: its message's place in the batch.

    (A tuple, not a frozen dataclass: one is made per message, and a tuple is
    made faster.)"""

    statement: Statement
    slot: int


def plan_flush(deferred: list[Deferred]) -> list[tuple[str, list[Deferred]]]:
    """Group deferred statements into as few statements as the order allows.

    Statements of different messages are independent; within a message their
    order matters (set_state, hop, then the transition). So they are grouped by
    (position within the message, kind), in that order: one statement per group.
    """
    groups: dict[tuple[int, str], list[Deferred]] = {}
    position: dict[int, int] = {}
    for item in deferred:
        level = position.get(item.slot, 0)
        position[item.slot] = level + 1
        groups.setdefault((level, item.statement.kind), []).append(item)
    return [(kind, items) for (_, kind), items in sorted(groups.items())]


def columns(items: list[Deferred]) -> tuple[list[Any], ...]:
    """The parameters of several statements of one kind as parallel arrays."""
    return tuple(list(c) for c in zip(*(i.statement.params for i in items), strict=True))


def one_call_params(items: list[Deferred]) -> tuple[Any, ...] | None:
    """The set-based call that does what these statements of one kind do, or None.

    Their first parameter is the row's id, the others (stage, target stage,
    dispatcher) must be the same in all of them; the call takes the ids as an
    array (:class:`~.adapters.Ids`) and each other parameter once. It does not
    apply to an id named twice: that row would change once, and both statements
    would read as done.
    """
    ids, *others = columns(items)
    if len(set(ids)) != len(ids) or any(len(set(c)) != 1 for c in others):
        return None
    return (Ids(ids), *(c[0] for c in others))


#: kind -> the set-based statement for a group of that kind (its parameters:
#: :func:`one_call_params`); the ids it changed come back.
SET_BASED: dict[str, str] = {
    "finish": FINISH_MANY,  # finish_many(ids, stage, dispatcher_id)
    "advance": ADVANCE_MANY,  # advance_many(ids, stage, to_stage, dispatcher_id)
}


class GroupBatch:
    """Group commit's bookkeeping for one batch: its transaction, the deferred
    statements, and the messages (by slot) whose row turned out lost when they
    were sent.

    The transaction begins lazily. A batch whose handlers never touch
    ``msg.db`` sends BEGIN, its deferred statements and COMMIT in one pipeline:
    one round trip (:meth:`commit`). The first message that opens a savepoint
    begins it at once (:meth:`open`), and the batch commits as before.
    """

    def __init__(
        self, conn: psycopg.Connection, set_based: frozenset[str] = frozenset(SET_BASED)
    ) -> None:
        self.conn = conn
        #: the kinds whose set-based function the database has (see sdk/entry.py)
        self.set_based = set_based
        #: the slot of the message being processed
        self.slot = 0
        self.deferred: list[Deferred] = []
        #: slot -> the error of its first statement that changed nothing
        self.lost: dict[int, str] = {}
        #: ids of the next batch (already waiting on stdin) to load in the commit's
        #: round trip, and their rows once loaded (None: not loaded)
        self.read_ahead: list[int] = []
        self.ahead_rows: dict[int, tuple[Any, ...]] | None = None
        #: the holder of each row pinned for this batch (sdk/pinning.py), or None
        self.holders: dict[int, int | None] | None = None
        #: the pin of the next batch's rows (its ids already waiting on stdin), sent
        #: after this batch's COMMIT in the same round trip; what it returned, its
        #: transaction left open for that batch (:meth:`adopt`)
        self.pin_ahead: tuple[Pin, list[int]] | None = None
        self.ahead_pinned: PinnedRows | None = None
        self._tx: psycopg.Transaction | None = None
        #: the transaction was begun by a plain BEGIN (the pin's): COMMIT ends it
        self._begun = False

    def pin(self, pin: Pin, ids: list[int]) -> dict[int, tuple[Any, ...]]:
        """Begin the batch's transaction with the pin of its rows
        (:meth:`~.pinning.Pin.begin`); the rows by id, their holders in
        :attr:`holders`. The deferred statements and the COMMIT then go in one
        pipeline, as without a pin."""
        return self.adopt(pin.begin(self.conn, ids) if ids else {}, bool(ids))

    def adopt(self, pinned: PinnedRows, begun: bool = True) -> dict[int, tuple[Any, ...]]:
        """Make the pin's transaction (``begun``: open) this batch's; the rows by id."""
        self._begun = begun
        self.holders = {i: holder for i, (_, holder) in pinned.items()}
        return {i: row for i, (row, _) in pinned.items()}

    def open(self) -> None:
        """Make sure the batch's transaction has begun, then send what was deferred
        so far, so that it runs before the savepoint about to be opened."""
        if self._tx is None and not self._begun:
            tx = self.conn.transaction()
            tx.__enter__()
            self._tx = tx
        self.flush()

    def commit(self) -> None:
        """Send what is deferred and commit the batch (one round trip when the
        transaction has not begun: BEGIN, the statements and COMMIT in one pipeline;
        then the rows of :attr:`read_ahead` are loaded in the same round trip, just
        before the COMMIT, and kept in :attr:`ahead_rows`; when the statements are
        one statement and nothing is read ahead, that statement alone)."""
        if self._tx is None:
            self._send_all(bracket=True)
            return
        self.flush()
        tx, self._tx = self._tx, None
        tx.__exit__(None, None, None)

    @property
    def begun(self) -> bool:
        """Has the batch's transaction begun (a savepoint opened it, or the pin)?"""
        return self._tx is not None or self._begun

    def abandon(self) -> None:
        """A handler ended the batch's transaction: forget it and what is deferred
        (whatever the handler left open is rolled back)."""
        tx, self._tx = self._tx, None
        self._begun = False
        self.deferred = []
        if tx is not None:
            with _quietly():
                tx.__exit__(psycopg.Rollback, psycopg.Rollback(), None)
        if not self.conn.broken and self.conn.info.transaction_status != _IDLE:
            self.conn.execute("ROLLBACK")

    def rollback(self) -> None:
        """Undo the batch (after an error), unless the connection is gone."""
        tx, self._tx = self._tx, None
        self._begun = False
        if self.conn.broken:
            return
        if tx is not None:
            tx.__exit__(psycopg.Rollback, psycopg.Rollback(), None)
        elif self.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            self.conn.execute("ROLLBACK")  # a bracketed pipeline that failed midway

    def defer(self, statement: Statement) -> None:
        """Queue a statement of the current message."""
        self.deferred.append(Deferred(statement, self.slot))

    def forget(self, slot: int) -> None:
        """Drop the deferred statements of the message at ``slot``."""
        self.deferred = [d for d in self.deferred if d.slot != slot]

    def note_results(self, items: list[Deferred], changed: list[bool]) -> None:
        """Record the messages whose statement changed nothing (the first one counts)."""
        for item, ok in zip(items, changed, strict=True):
            if not ok:
                self.lost.setdefault(item.slot, item.statement.lost)

    def flush(self) -> None:
        """Send the deferred statements in one pipeline; note rows lost."""
        self._send_all(bracket=False)

    def _send_all(self, bracket: bool) -> None:
        """Send the deferred statements in one pipeline (between BEGIN and COMMIT
        with ``bracket``, then :attr:`read_ahead` or :attr:`pin_ahead`); note rows lost."""
        deferred, self.deferred = self.deferred, []
        groups = plan_flush(deferred) if deferred else []
        begin = bracket and not self._begun and bool(groups)
        commit = bracket and (self._begun or begin)
        pin_ahead = self.pin_ahead if bracket else None
        if not (groups or commit or pin_ahead):
            return
        try:
            if begin and len(groups) == 1 and not self.read_ahead and pin_ahead is None:
                # One statement is a transaction of its own in autocommit: no
                # BEGIN, COMMIT or pipeline needed (a batch of no-op handlers that
                # all finish, say: one set-based call, one round trip, one commit).
                kind, items = groups[0]
                self.note_results(items, self._send(kind, items)())
                return
            with self.conn.pipeline():
                if begin:
                    self.conn.execute("BEGIN")
                sent = [(self._send(kind, items), items) for kind, items in groups]
                ahead = None
                if commit and self.read_ahead:
                    # Inside the transaction: a row of this batch reads as it commits.
                    ahead = self.conn.execute(GET_MESSAGES, (self.read_ahead,))
                if commit:
                    self.conn.execute("COMMIT")
                # After it: the next batch's transaction, its rows pinned.
                pinned = pin_ahead[0].send(self.conn, pin_ahead[1]) if pin_ahead else None
            if bracket:
                self._begun = False
            for results, items in sent:
                self.note_results(items, results())
            if ahead is not None:
                self.ahead_rows = {row[0]: row for row in ahead.fetchall()}
            if pinned is not None:
                self.ahead_pinned = Pin.rows(pinned)
        except psycopg.Error as exc:
            if self.conn.broken:
                raise
            self.rollback()
            raise BatchFailed(f"group commit batch failed: {exc_reason(exc)}") from exc

    def _send(self, kind: str, items: list[Deferred]) -> Callable[[], list[bool]]:
        """Queue the statement(s) of one group; what reads, after the pipeline, whether
        each item changed its row."""
        if len(items) == 1:
            cur = self.conn.execute(SINGLE[kind], items[0].statement.params)
            return lambda: [bool(row and row[0]) for row in cur.fetchall()]
        call = one_call_params(items) if kind in self.set_based else None
        if call is not None:  # one set-based UPDATE: the ids it changed come back
            ids = call[0]
            cur = self.conn.execute(SET_BASED[kind], call)
            return lambda: _changed(ids, {row[0] for row in cur.fetchall()})
        cur = self.conn.execute(MANY[kind], columns(items))
        return lambda: [bool(row and row[0]) for row in cur.fetchall()]


def _changed(ids: list[int], done: set[int]) -> list[bool]:
    return [i in done for i in ids]


class Scope:
    """The transaction levels of one message, entered lazily.

    A level is a transaction, or a savepoint when one is open already (always
    in group commit, where the batch's transaction is). ``batch`` is the group
    commit batch (required with :attr:`CommitMode.GROUP`); it is flushed before
    a level is opened, so that the deferred statements run before this
    message's savepoint and are not rolled back with it.
    """

    def __init__(
        self,
        conn: psycopg.Connection,
        mode: CommitMode = CommitMode.PER_MESSAGE,
        batch: GroupBatch | None = None,
        ahead: ReadAhead | None = None,
        pinned: bool = False,
    ) -> None:
        if mode is CommitMode.GROUP and batch is None:
            raise ValueError("group commit needs its batch")
        self.conn = conn
        self.mode = mode
        self.batch = batch
        #: sends a statement run alone in autocommit with the next rows (sdk/ahead.py)
        self.ahead = ahead
        #: one commit per message: the transaction the pin of this message's row
        #: began (sdk/pinning.py) is open under its levels; :meth:`commit` ends it
        self.pinned = pinned
        self._levels: list[psycopg.Transaction] = []
        self._before_push: Callable[[], None] | None = batch.open if batch else None

    @property
    def depth(self) -> int:
        """How many levels are open."""
        return len(self._levels)

    def enter(self) -> None:
        """Make sure at least one level is open."""
        if not self._levels:
            self.push()

    def push(self) -> None:
        """Open one more level."""
        if self._before_push is not None:
            self._before_push()
        tx = self.conn.transaction()
        tx.__enter__()
        self._levels.append(tx)

    def ended(self) -> bool:
        """Has the transaction this message runs in ended under it (a handler's
        ``COMMIT`` or ``ROLLBACK`` on ``msg.db``)? libpq's transaction status
        says it, no round trip: idle while a level, the pin's transaction or the
        batch's is open."""
        if self.conn.broken or self.conn.info.transaction_status != _IDLE:
            return False
        return bool(self._levels) or self.pinned or (self.batch is not None and self.batch.begun)

    def abandon(self) -> None:
        """The transaction under this message's levels ended: forget the levels
        (and in group commit the batch's transaction) and roll back whatever is
        open now (a transaction the handler began after its COMMIT, say)."""
        with _quietly():
            self.rollback_to(0)
        self.pinned = False
        if self.batch is not None:
            self.batch.abandon()
        elif not self.conn.broken and self.conn.info.transaction_status != _IDLE:
            self.conn.execute("ROLLBACK")

    def rollback_to(self, depth: int) -> None:
        """Roll back levels until only ``depth`` are left."""
        while len(self._levels) > depth:
            tx = self._levels.pop()
            tx.__exit__(psycopg.Rollback, psycopg.Rollback(), None)

    def commit(self) -> None:
        """Release/commit every open level, innermost first (and the pinned
        transaction, if still open)."""
        while self._levels:
            self._levels.pop().__exit__(None, None, None)
        if self.pinned:
            self.pinned = False
            self.conn.execute("COMMIT")

    def _last_and_commit(self, statement: Statement) -> Any:
        """Pinned, no level open: the statement and COMMIT in one pipeline (one
        round trip, as the statement alone in autocommit would be); its first row.
        A statement that fails leaves the transaction rolled back."""
        self.pinned = False
        conn = self.conn
        try:
            with conn.pipeline():
                cur = conn.execute(SINGLE[statement.kind], statement.params)
                conn.execute("COMMIT")
        except psycopg.Error:
            if (
                not conn.broken
                and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
            ):
                conn.execute("ROLLBACK")
            raise
        return cur.fetchone()

    def write(self, statement: Statement, role: Role) -> None:
        """Send one statement of this message as :func:`call_mode` says.

        Raises :class:`RowLost` when it changed nothing. A deferred statement is
        checked when the batch is flushed (:attr:`GroupBatch.lost`).
        """
        mode = call_mode(self.mode, len(self._levels), role)
        if mode is CallMode.DEFERRED:
            assert self.batch is not None
            self.batch.defer(statement)
            return
        if mode is CallMode.IN_TRANSACTION:
            self.enter()
        elif self.pinned:  # AUTOCOMMIT: in the pinned transaction, committed with it
            row = self._last_and_commit(statement)
            if not (row and row[0]):
                raise RowLost(statement.lost)
            return
        elif self.ahead is not None:  # AUTOCOMMIT: read ahead in the same round trip
            row = self.ahead.send(self.conn, SINGLE[statement.kind], statement.params)
            if not (row and row[0]):
                raise RowLost(statement.lost)
            return
        row = self.conn.execute(SINGLE[statement.kind], statement.params).fetchone()
        if not (row and row[0]):
            raise RowLost(statement.lost)


class HandlerScope:
    """What ``msg.db`` opens: one level (transaction or savepoint) for the handler's writes."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.conn = scope.conn
        self._opened = False

    def enter(self) -> None:
        """Open the handler's level, once."""
        if not self._opened:
            self.scope.push()
            self._opened = True
