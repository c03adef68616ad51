"""SDK for stage programs written in Python: the worker side of the pipe protocol (SPEC §5).

A stage program is a handler per stage and one call to :func:`run`::

    from pepsi_dispatch.worker import Advance, Finish, Message, run

    def resize(msg: Message):
        msg.state["size"] = len(msg.payload["image"])
        return Advance("upload")

    def upload(msg: Message):
        return Finish()

    if __name__ == "__main__":
        run({"resize": resize, "upload": upload})

The dispatcher starts ``PROGRAM [-c CONFIG] worker`` with ``PEPSI_STAGE``,
``PEPSI_DSN`` and ``PEPSI_DISPATCHER_ID`` in the environment and writes ids to
stdin. For every id :func:`run` loads the row, calls the handler of the row's
stage with a :class:`Message` and applies the transition the handler returns
(:class:`Advance`, :class:`Finish`, :class:`Pause`, :class:`Fail`; ``None`` means
the default: advance to the only successor, or finish a final stage) through the
SQL API with the dispatcher id as fencing token, commits, and only then answers
the status line. Changes the handler makes to ``msg.state`` are merged into the
row's state in the same transaction, and statements it runs on ``msg.db`` (the
worker's one connection) commit or roll back together with the transition.

* A handler that raises fails that message (``state.error`` = ``Type: message``),
  answers ``1 Type: message``, and the worker lives on. At a stage with
  ``RETRY_DELAY`` (automatic retries, read from the dispatcher's registered
  stage table at start) the row is left running instead and the answer alone
  tells the dispatcher, which pauses it for the next retry -- or, once
  MAX_RETRIES are used up, fails it with ``dispatch_error`` = the answer.
* An advance to a stage the graph (``NEXT`` of the stage, from the configuration
  file plus the database overlay) does not allow fails the message with an error
  naming the allowed successors.
* ``Advance("b", fuse=True)`` runs this program's handler for ``b`` in the same
  pass (the row moves to ``b`` with ``pepsi.hop`` and stays running), and the
  answer is ``0 fused=b``. A pause or failure after a hop happens at the fused stage.
* ``group_commit=True``: the ids already waiting on stdin are processed in one
  transaction (a savepoint per message, so one failure rolls back only its own
  message), committed once, then all answered.
* EOF on stdin: exit 0. SIGTERM/SIGINT: finish the message in hand, answer it, exit 0.

Nothing but answers is ever written to the protocol's stdout: at start the SDK
moves the real stdout aside and points file descriptor 1 and ``sys.stdout`` at
stderr, so ``print()`` in a handler (or a child process) lands in the
dispatcher's log. Likewise stdin is replaced by ``/dev/null`` for handlers.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import FrameType
from typing import Any

import psycopg
from psycopg import pq
from psycopg.types.json import Jsonb

from pepsi_dispatch.protocol import EXIT_NO_STAGE

from .backoff import Backoff

__all__ = [
    "Advance",
    "Fail",
    "Finish",
    "Handler",
    "Message",
    "Pause",
    "Transition",
    "run",
]

#: Longest reason put on an answer line (the dispatcher cuts lines at 8 KiB).
MAX_REASON = 2000
#: Exit status "I could not reach the database; nothing I held is done"
#: (sysexits.h EX_TEMPFAIL): the dispatcher releases the worker's messages.
EX_TEMPFAIL = 75
#: How long a worker tries to reconnect after losing its database connection (seconds).
RECONNECT_TIMEOUT = float(os.environ.get("PEPSI_WORKER_RECONNECT_TIMEOUT", "60"))

# The statements of the SQL API the SDK sends, and (for group commit) the same
# call over arrays: many messages' transitions in one statement.
_CALLS: dict[str, tuple[str, tuple[str, ...]]] = {
    "advance": ("pepsi.advance({0}, {1}, {2}, {3})", ("bigint", "text", "text", "bigint")),
    "finish": ("pepsi.finish({0}, {1}, {2})", ("bigint", "text", "bigint")),
    "pause_at": (
        "pepsi.pause({0}, {1}, {2}, {3}, {4})",
        ("bigint", "text", "timestamptz", "text", "bigint"),
    ),
    "pause_in": (
        "pepsi.pause({0}, {1}, clock_timestamp() + {2} * interval '1 second', {3}, {4})",
        ("bigint", "text", "float8", "text", "bigint"),
    ),
    "fail": ("pepsi.fail({0}, {1}, {2}, {3})", ("bigint", "text", "text", "bigint")),
    "set_state": ("pepsi.set_state({0}, {1}, {2}, {3})", ("bigint", "text", "jsonb", "bigint")),
    "hop": ("pepsi.hop({0}, {1}, {2}, {3})", ("bigint", "text", "text", "bigint")),
}
_SINGLE = {
    kind: "SELECT " + call.format(*(f"%s::{t}" for t in types))
    for kind, (call, types) in _CALLS.items()
}
_MANY = {
    kind: "SELECT "
    + call.format(*(f"u.a{i}" for i in range(len(types))))
    + " FROM unnest("
    + ", ".join(f"%s::{t}[]" for t in types)
    + ") WITH ORDINALITY AS u("
    + ", ".join(f"a{i}" for i in range(len(types)))
    + ", n) ORDER BY u.n"
    for kind, (call, types) in _CALLS.items()
}


# --------------------------------------------------------------------------- transitions


@dataclass(frozen=True)
class Advance:
    """Hand the message to successor stage ``to`` (must be in this stage's NEXT).

    With ``fuse=True`` and a handler for ``to`` in this program, that handler runs
    in the same pass instead of going back through the dispatcher.
    """

    to: str
    fuse: bool = False


@dataclass(frozen=True)
class Finish:
    """The message is done (status ``done``)."""


@dataclass(frozen=True)
class Pause:
    """Park the message and retry it at the current stage later.

    ``when`` is a number of seconds, a :class:`~datetime.timedelta`, or a
    :class:`~datetime.datetime` (use an aware one; a naive one is read in the
    database session's time zone). ``reason`` is kept in ``state.pause_reason``.
    The dispatcher flips it back to pending when due, counting a retry; after the
    stage's MAX_RETRIES it fails instead.
    """

    when: float | timedelta | datetime
    reason: str | None = None


@dataclass(frozen=True)
class Fail:
    """The message failed: status ``failed``, ``reason`` in ``state.error``."""

    reason: str


Transition = Advance | Finish | Pause | Fail


@dataclass
class Message:
    """One message as its handler sees it.

    ``payload`` is the message as enqueued (read-only by convention), ``state`` a
    dict of mutable notes: changes to its top-level keys are merged into the row
    when the handler returns (a key cannot be deleted, set it to ``None``).
    ``retries`` counts how often a pause at this stage came due. ``db`` is the
    worker's database connection; what a handler executes on it commits together
    with the message's transition (or is rolled back with it).
    """

    id: int
    stage: str
    payload: Any
    state: dict[str, Any]
    retries: int
    #: Stages already run in this pass before this one (fusion), oldest first.
    fused_from: tuple[str, ...] = ()
    _scope: _HandlerScope | None = field(default=None, repr=False, compare=False)

    @property
    def db(self) -> psycopg.Connection:
        """The worker's connection, inside this message's transaction."""
        if self._scope is None:
            raise RuntimeError("this message is not being processed")
        self._scope.enter()
        return self._scope.conn


Handler = Callable[[Message], Transition | None]


# --------------------------------------------------------------------------- internals


class _Stop(Exception):
    """Raised by the signal handler while the worker waits for input."""


class _RowLost(Exception):
    """A transition changed nothing: the row is no longer ours."""


class _Fatal(BaseException):
    """The batch transaction failed beyond repair: roll back, answer nothing, exit 1.

    A BaseException so that a handler's ``except Exception`` cannot swallow it.
    """


class _Scope:
    """The transaction levels of one message, entered lazily.

    Outside group commit the first level is a real transaction (BEGIN); inside
    group commit every level is a savepoint of the batch transaction. A message
    whose handler never touches ``msg.db`` and needs a single statement runs it
    without any explicit transaction (one round trip, one commit).
    """

    def __init__(
        self, conn: psycopg.Connection, before_push: Callable[[], None] | None = None
    ) -> None:
        self.conn = conn
        self._levels: list[psycopg.Transaction] = []
        self._before_push = before_push

    @property
    def depth(self) -> int:
        return len(self._levels)

    def enter(self) -> None:
        """Make sure at least one level is open."""
        if not self._levels:
            self.push()

    def push(self) -> None:
        if self._before_push is not None:
            self._before_push()
        tx = self.conn.transaction()
        tx.__enter__()
        self._levels.append(tx)

    def rollback_to(self, depth: int) -> None:
        """Roll back levels until only ``depth`` are left."""
        while len(self._levels) > depth:
            tx = self._levels.pop()
            tx.__exit__(psycopg.Rollback, psycopg.Rollback(), None)

    def commit(self) -> None:
        """Release/commit every open level, innermost first."""
        while self._levels:
            self._levels.pop().__exit__(None, None, None)


def _as_is(text: str) -> str:
    """Jsonb ``dumps`` for text that is JSON already."""
    return text


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    if len(text) > MAX_REASON:
        text = text[: MAX_REASON - 3] + "..."
    return text or "failed"


def _exc_reason(exc: BaseException) -> str:
    message = str(exc)
    name = type(exc).__name__
    return _one_line(f"{name}: {message}" if message else name)


class _Reader:
    """Reads id lines from a raw file descriptor, reporting what is already buffered."""

    def __init__(self, fd: int, on_wait: Callable[[bool], None]) -> None:
        self.fd = fd
        self.buf = b""
        self.eof = False
        self._on_wait = on_wait

    def _fill(self, block: bool) -> None:
        if self.eof:
            return
        if block:
            self._on_wait(True)  # a stop signal may interrupt the wait
            try:
                chunk = os.read(self.fd, 65536)
            finally:
                self._on_wait(False)
        else:
            ready, _, _ = select.select([self.fd], [], [], 0)
            if not ready:
                return
            chunk = os.read(self.fd, 65536)
        if chunk:
            self.buf += chunk
        else:
            self.eof = True

    def lines(self) -> list[bytes]:
        """Block until at least one line (or EOF), then return every complete line buffered.

        An empty list means EOF. A last line without newline at EOF counts as a line.
        """
        while True:
            while b"\n" not in self.buf and not self.eof:
                self._fill(block=True)
            self._fill(block=False)
            out: list[bytes] = []
            if b"\n" in self.buf:
                head, _, self.buf = self.buf.rpartition(b"\n")
                out = [line for line in head.split(b"\n") if line.strip()]
            elif self.eof:
                out = [self.buf] if self.buf.strip() else []
                self.buf = b""
            if out or (self.eof and not self.buf):
                return out


@dataclass
class _Outcome:
    answer: str  # the status line, without newline
    ok: bool


class _Worker:
    def __init__(
        self,
        handlers: Mapping[str, Handler],
        stage: str,
        conn: psycopg.Connection,
        dispatcher_id: int | None,
        successors: dict[str, tuple[str, ...]] | None,
        config_name: str,
        group_commit: bool,
        answer_fd: int,
        input_fd: int,
        connect: Callable[[], psycopg.Connection] | None = None,
        retry_stages: frozenset[str] = frozenset(),
    ) -> None:
        self.handlers = dict(handlers)
        #: stages with automatic retries: a handler exception there is left to
        #: the dispatcher (record_dispatch_error retries or fails it).
        self.retry_stages = retry_stages
        self._connect_fn = connect
        self.stage = stage
        self.conn = conn
        self.did = dispatcher_id
        self.successors = successors
        self.config_name = config_name
        self.group_commit = group_commit
        self.answer_fd = answer_fd
        self.reader = _Reader(input_fd, self._waiting)
        self.stop = False
        self._idle = False
        # group commit: statements deferred to the batch pipeline (kind, params, slot, lost)
        self._deferred: list[tuple[str, tuple, int, str]] = []
        self._lost_slots: dict[int, str] = {}
        self._slot = 0
        self._retrying = False

    # -- signals

    def _waiting(self, idle: bool) -> None:
        self._idle = idle
        if idle and self.stop:
            raise _Stop

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop = True
        if self._idle:
            raise _Stop

    # -- main loop

    def serve(self) -> int:
        try:
            while not self.stop:
                lines = self.reader.lines()
                if not lines:
                    return 0  # EOF
                self._run_batch(lines)
        except _Stop:
            return 0
        except _Fatal as exc:
            print(f"pepsi worker: {exc}; exiting", file=sys.stderr)
            return 1
        except BrokenPipeError:
            print("pepsi worker: the dispatcher closed our stdout; exiting", file=sys.stderr)
            return 1
        return 0

    def _run_batch(self, lines: list[bytes]) -> None:
        """Process the lines; after a lost connection reconnect and redo what is unanswered."""
        self._retrying = False
        while True:
            try:
                if self.group_commit and len(lines) > 1:
                    self._batch_group(lines)
                else:
                    self._batch_single(lines)  # removes the lines it answered
                return
            except psycopg.OperationalError as exc:
                if not self.conn.broken:
                    raise
                print(f"pepsi worker: database connection lost: {exc}", file=sys.stderr)
                self._reconnect()
                self._retrying = True

    def _connect(self) -> psycopg.Connection:
        if self._connect_fn is None:
            raise psycopg.OperationalError("no way to reconnect")
        return self._connect_fn()

    def _reconnect(self) -> None:
        """New connection with backoff; raises the last error after RECONNECT_TIMEOUT."""
        deadline = time.monotonic() + RECONNECT_TIMEOUT
        backoff = Backoff(0.1, 2.0)
        while True:
            try:
                self.conn = self._connect()
            except psycopg.OperationalError:
                if time.monotonic() + backoff.peek() > deadline:
                    raise
                time.sleep(backoff.next())
            else:
                print("pepsi worker: reconnected to the database", file=sys.stderr)
                return

    def _answer(self, lines: list[str]) -> None:
        data = "".join(line + "\n" for line in lines).encode()
        while data:
            n = os.write(self.answer_fd, data)
            data = data[n:]

    def _load(self, lines: list[bytes]) -> list[tuple[bytes, int | None, tuple | None]]:
        ids: list[int] = []
        parsed: list[int | None] = []
        for line in lines:
            try:
                value = int(line.strip())
            except ValueError:
                value = None
            parsed.append(value)
            if value is not None:
                ids.append(value)
        rows: dict[int, tuple] = {}
        if ids:
            cur = self.conn.execute(
                "SELECT workqueue_id, stage, status, payload, state, retries"
                " FROM pepsi.get_messages(%s)",
                (ids,),
            )
            rows = {row[0]: row for row in cur.fetchall()}
        return [
            (line, value, rows.get(value) if value is not None else None)
            for line, value in zip(lines, parsed, strict=True)
        ]

    def _batch_single(self, lines: list[bytes]) -> None:
        for line, value, row in self._load(lines):
            scope = _Scope(self.conn)
            outcome = self._process(line, value, row, scope)
            scope.commit()
            self._answer([outcome.answer])
            del lines[0]
            self._retrying = False  # only the message in hand may have committed unanswered
            if self.stop:
                return

    def _batch_group(self, lines: list[bytes]) -> None:
        """One transaction for the batch; statements of messages whose handler did not
        touch ``msg.db`` are deferred and sent together in one pipeline before the commit."""
        loaded = self._load(lines)
        outcomes: list[_Outcome] = []
        self._deferred = []
        self._lost_slots = {}
        ending: BaseException | None = None
        with self.conn.transaction():
            for line, value, row in loaded:
                self._slot = len(outcomes)
                scope = _Scope(self.conn, before_push=self._flush)
                try:
                    outcome = self._process(line, value, row, scope, group=True)
                except (SystemExit, KeyboardInterrupt) as exc:
                    # A handler ends the process (sys.exit): commit and answer the
                    # messages before it first, so that this one is the head of line
                    # the dispatcher blames, not the group's first, innocent message.
                    scope.rollback_to(0)
                    self._deferred = [d for d in self._deferred if d[2] != self._slot]
                    ending = exc
                    break
                scope.commit()
                outcomes.append(outcome)
                if self.stop:
                    break
            self._flush()
        for slot, lost in self._lost_slots.items():
            print(f"pepsi worker: {lost}", file=sys.stderr)
            outcomes[slot] = _Outcome(f"1 {_one_line(lost)}", False)
        self._answer([o.answer for o in outcomes])
        if ending is not None:
            raise ending

    def _flush(self) -> None:
        """Send the deferred statements of the batch in one pipeline; note rows lost."""
        deferred, self._deferred = self._deferred, []
        if not deferred:
            return
        # Statements of different messages are independent; within a message their
        # order matters (set_state, hop, then the transition). So group them by
        # (position within the message, kind): one statement over arrays per group.
        groups: dict[tuple[int, str], list[tuple[tuple, int, str]]] = {}
        position: dict[int, int] = {}
        for kind, params, slot, lost in deferred:
            level = position.get(slot, 0)
            position[slot] = level + 1
            groups.setdefault((level, kind), []).append((params, slot, lost))
        try:
            with self.conn.pipeline():
                cursors = []
                for (_, kind), items in sorted(groups.items()):
                    if len(items) == 1:
                        cur = self.conn.execute(_SINGLE[kind], items[0][0])
                    else:
                        columns = tuple(list(c) for c in zip(*(i[0] for i in items), strict=True))
                        cur = self.conn.execute(_MANY[kind], columns)
                    cursors.append((cur, items))
            for cur, items in cursors:
                rows = cur.fetchall()
                for (_, slot, lost), row in zip(items, rows, strict=True):
                    if not (row and row[0]):
                        self._lost_slots.setdefault(slot, lost)
        except psycopg.Error as exc:
            if self.conn.broken:
                raise
            raise _Fatal(f"group commit batch failed: {_exc_reason(exc)}") from exc

    # -- one message

    def _process(
        self,
        line: bytes,
        value: int | None,
        row: tuple | None,
        scope: _Scope,
        group: bool = False,
    ) -> _Outcome:
        if value is None:
            return _Outcome(
                f"1 not a message id: {_one_line(line.decode(errors='replace'))}", False
            )
        if row is None:
            return _Outcome(f"1 message {value} does not exist", False)
        _, stage, status, payload, state, retries = row
        if status != "running" or stage != self.stage:
            if self._retrying:
                # Redone after a lost connection: our commit went through, its
                # acknowledgement was lost. The row has moved on; nothing to do.
                print(
                    f"pepsi worker: message {value} already moved on ({status} at stage"
                    f" {stage}) before the connection was lost",
                    file=sys.stderr,
                )
                return _Outcome("0", True)
            return _Outcome(
                f"1 message {value} is not running at stage {self.stage}"
                f" (it is {status} at stage {stage})",
                False,
            )
        try:
            return self._run_stages(value, stage, payload, dict(state or {}), retries, scope, group)
        except _RowLost as exc:
            scope.rollback_to(0)
            print(f"pepsi worker: {exc}", file=sys.stderr)
            return _Outcome(f"1 {_one_line(str(exc))}", False)
        except psycopg.Error as exc:
            if self.conn.broken:
                raise  # a lost connection: _run_batch reconnects and redoes the message
            # A statement of this message failed: undo all of it, then fail the row
            # where it was (at the stage it was handed to us).
            scope.rollback_to(0)
            if group and self.conn.info.transaction_status == pq.TransactionStatus.INERROR:
                # no savepoint of this message to roll back to: the batch is lost
                raise _Fatal(f"group commit batch failed: {_exc_reason(exc)}") from exc
            reason = _one_line(f"database error: {_exc_reason(exc)}")
            print(f"pepsi worker: message {value}: {reason}", file=sys.stderr)
            try:
                self._execute_fail(scope, value, stage, reason, group)
                scope.commit()
            except _RowLost:
                scope.rollback_to(0)
            return _Outcome(f"1 {reason}", False)

    def _call(
        self, kind: str, params: tuple, scope: _Scope, group: bool, alone: bool, lost: str
    ) -> None:
        """Execute one transition statement; raise _RowLost(lost) when it changed nothing.

        Outside group commit a lone statement runs in autocommit, several share a
        transaction. In group commit, a message without a savepoint of its own has
        its statements deferred to the batch's pipeline (see :meth:`_flush`).
        """
        if group:
            if scope.depth == 0:
                self._deferred.append((kind, params, self._slot, lost))
                return
        elif not alone:
            scope.enter()
        row = self.conn.execute(_SINGLE[kind], params).fetchone()
        if not (row and row[0]):
            raise _RowLost(lost)

    def _execute_fail(self, scope: _Scope, mid: int, stage: str, reason: str, group: bool) -> None:
        self._call(
            "fail",
            (mid, stage, reason, self.did),
            scope,
            group,
            alone=scope.depth == 0,
            lost=self._lost(mid, stage, "fail"),
        )

    def _lost(self, mid: int, stage: str, what: str) -> str:
        holder = f" under dispatcher {self.did}" if self.did is not None else ""
        return (
            f"{what} of message {mid} changed nothing: it is no longer running at stage"
            f" {stage}{holder} (the dispatcher may have timed it out or requeued it)"
        )

    def _run_stages(
        self,
        mid: int,
        stage: str,
        payload: Any,
        state: dict[str, Any],
        retries: int,
        scope: _Scope,
        group: bool,
    ) -> _Outcome:
        path = [stage]  # stages run in this pass, the current one last
        while True:
            handler = self.handlers.get(stage)
            base = scope.depth
            original = copy.deepcopy(state) if state else {}  # nested values may be mutated
            msg = Message(
                id=mid,
                stage=stage,
                payload=payload,
                state=state,
                retries=retries,
                fused_from=tuple(path[:-1]),
                _scope=_HandlerScope(scope),
            )
            prefix = f"[{stage}] " if len(path) > 1 else ""
            try:
                if handler is None:
                    raise LookupError(f"this program has no handler for stage {stage}")
                saved = sys.stdout
                try:
                    result = handler(msg)
                finally:
                    sys.stdout = saved
                transition = self._normalise(stage, result)
                patch = {
                    k: v for k, v in msg.state.items() if k not in original or original[k] != v
                }
                patch.pop("dispatch_error", None)
                try:
                    patch_json = json.dumps(patch) if patch else None
                except (TypeError, ValueError) as exc:
                    raise _Refused(f"msg.state cannot be stored as JSON: {exc}") from None
                fuse = (
                    isinstance(transition, Advance)
                    and transition.fuse
                    and transition.to in self.handlers
                )
                final = None if fuse else self._statement(mid, stage, transition, prefix)
            except Exception as exc:  # the handler failed: this message fails, we live on
                if isinstance(exc, _Refused):
                    reason = _one_line(prefix + str(exc))
                    print(f"pepsi worker: message {mid}: {reason}", file=sys.stderr)
                else:
                    traceback.print_exc(file=sys.stderr)
                    reason = _one_line(prefix + _exc_reason(exc))
                scope.rollback_to(base)  # undo what this stage's handler wrote
                if stage not in self.retry_stages or isinstance(exc, _Refused):
                    self._execute_fail(scope, mid, stage, reason, group)
                scope.commit()
                return _Outcome(f"1 {reason}", False)

            state = msg.state
            if patch_json is not None:
                self._call(
                    "set_state",
                    (mid, stage, Jsonb(patch_json, dumps=_as_is), self.did),
                    scope,
                    group,
                    alone=False,
                    lost=self._lost(mid, stage, "set_state"),
                )

            if fuse:
                assert isinstance(transition, Advance)
                self._call(
                    "hop",
                    (mid, stage, transition.to, self.did),
                    scope,
                    group,
                    alone=False,
                    lost=self._lost(mid, stage, "hop"),
                )
                stage = transition.to
                path.append(stage)
                retries = 0
                continue

            assert final is not None
            kind, params, what = final
            self._call(
                kind,
                params,
                scope,
                group,
                alone=scope.depth == 0,
                lost=self._lost(mid, stage, what),
            )
            scope.commit()
            if isinstance(transition, Fail):
                return _Outcome(f"1 {_one_line(prefix + str(transition.reason))}", False)
            if len(path) > 1:
                return _Outcome("0 fused=" + ",".join(path[1:]), True)
            return _Outcome("0", True)

    def _statement(
        self, mid: int, stage: str, transition: Transition, prefix: str
    ) -> tuple[str, tuple, str]:
        """Kind, parameters and name of the final transition."""
        if isinstance(transition, Advance):
            return "advance", (mid, stage, transition.to, self.did), "advance"
        if isinstance(transition, Finish):
            return "finish", (mid, stage, self.did), "finish"
        if isinstance(transition, Pause):
            when = transition.when
            if isinstance(when, datetime):
                return "pause_at", (mid, stage, when, transition.reason, self.did), "pause"
            if isinstance(when, timedelta):
                seconds = when.total_seconds()
            elif isinstance(when, (int, float)) and not isinstance(when, bool):
                seconds = float(when)
            else:
                raise _Refused(
                    f"Pause needs seconds, a timedelta or a datetime, not {type(when).__name__}"
                )
            return "pause_in", (mid, stage, seconds, transition.reason, self.did), "pause"
        reason = _one_line(prefix + str(transition.reason))
        return "fail", (mid, stage, reason, self.did), "fail"

    def _normalise(self, stage: str, result: Any) -> Transition:
        allowed = None if self.successors is None else self.successors.get(stage)
        if result is None:
            if allowed is None:
                raise _Refused(
                    f"handler of stage {stage} returned None, and stage {stage} is not in the"
                    f" configuration ({self.config_name}); return Advance(...) or Finish()"
                )
            if not allowed:
                return Finish()
            if len(allowed) == 1:
                return Advance(allowed[0])
            raise _Refused(
                f"handler of stage {stage} returned None, but stage {stage} has several"
                f" successors ({', '.join(allowed)}); return Advance(name)"
            )
        if isinstance(result, (Finish, Pause, Fail)):
            return result
        if isinstance(result, Advance):
            if allowed is None:
                raise _Refused(
                    f"stage {stage} cannot advance to {result.to}: stage {stage} is not in the"
                    f" configuration ({self.config_name}), so its successors are unknown"
                )
            if result.to not in allowed:
                if allowed:
                    which = "allowed successors: " + ", ".join(allowed)
                else:
                    which = f"{stage} is a final stage (no NEXT)"
                raise _Refused(
                    f"stage {stage} may not advance to {result.to} ({which};"
                    f" NEXT of [stage-{stage}] in {self.config_name})"
                )
            return result
        raise _Refused(
            f"handler of stage {stage} returned {type(result).__name__}, not a transition;"
            " return Advance, Finish, Pause, Fail or None"
        )


class _Refused(Exception):
    """The handler asked for a transition that is not allowed."""


class _HandlerScope:
    """What ``msg.db`` opens: one level (transaction or savepoint) for the handler's writes."""

    def __init__(self, scope: _Scope) -> None:
        self.scope = scope
        self.conn = scope.conn
        self._opened = False

    def enter(self) -> None:
        if not self._opened:
            self.scope.push()
            self._opened = True


# --------------------------------------------------------------------------- entry point


def _parse_argv(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=os.path.basename(sys.argv[0] or "stage"),
        description="pepsi-dispatch stage program (started by the dispatcher as"
        " 'PROGRAM [-c CONFIG] worker' with PEPSI_STAGE, PEPSI_DSN, PEPSI_DISPATCHER_ID).",
    )
    parser.add_argument("-c", "--config", help="pepsi.conf to read the stage graph from")
    parser.add_argument("command", choices=["worker"], help="the one subcommand: worker")
    return parser.parse_args(argv)


def _fail_start(message: str) -> int:
    print(f"pepsi worker: error: {message}", file=sys.stderr)
    return 2


def _retry_stages(conn: psycopg.Connection) -> frozenset[str]:
    """Registered stages with automatic retries (RETRY_DELAY); none before migration 0009."""
    try:
        rows = conn.execute(
            "SELECT stage FROM pepsi.registered_stages() WHERE retry_delay IS NOT NULL"
        ).fetchall()
    except (psycopg.errors.UndefinedFunction, psycopg.errors.InsufficientPrivilege):
        return frozenset()
    return frozenset(r[0] for r in rows)


def _load_graph(
    config_path: str | None, conn: psycopg.Connection | None
) -> tuple[dict[str, tuple[str, ...]] | None, str, str]:
    """(successors by stage, name of the configuration, dsn) from file plus database overlay."""
    from pepsi_dispatch.config import apply_overlay, load_config

    config = load_config(config_path)
    name = str(config.path) if config.path else "built-in defaults"
    if conn is not None:
        rows = conn.execute("SELECT section, option, value FROM pepsi.stage_config()").fetchall()
        if rows:
            config = apply_overlay(config, rows)
            name += " + database overlay"
    return {s.name: tuple(s.next) for s in config.stages.values()}, name, config.dsn


def run(
    handlers: Mapping[str, Handler],
    group_commit: bool = False,
    argv: list[str] | None = None,
) -> None:
    """Run this program as a pepsi-dispatch worker; never returns (exits the process).

    Args:
        handlers: stage name → handler. The handler of ``$PEPSI_STAGE`` serves the
            ids read from stdin; the others are used when a handler fuses into them.
        group_commit: process the ids already waiting on stdin in one transaction
            and commit once (answers are sent after the commit).
        argv: command line (default ``sys.argv[1:]``): ``[-c CONFIG] worker``.

    Exit status: 0 after EOF or SIGTERM/SIGINT, 2 for usage or configuration
    errors, 75 (EX_TEMPFAIL) when the database cannot be reached (at start, or
    reconnecting gave up after PEPSI_WORKER_RECONNECT_TIMEOUT), 78 (EX_CONFIG)
    when ``$PEPSI_STAGE`` is not a stage of the configuration found (no message
    is touched), 1 for other fatal errors.
    """
    sys.exit(_main(handlers, group_commit, sys.argv[1:] if argv is None else argv))


def _main(handlers: Mapping[str, Handler], group_commit: bool, argv: list[str]) -> int:
    args = _parse_argv(argv)
    stage = os.environ.get("PEPSI_STAGE", "")
    if not stage:
        return _fail_start("PEPSI_STAGE is not set (workers are started by pepsi-dispatch)")
    if stage not in handlers:
        known = ", ".join(sorted(handlers)) or "none"
        return _fail_start(f"this program has no handler for stage {stage} (it has: {known})")
    did_text = os.environ.get("PEPSI_DISPATCHER_ID", "").strip()
    try:
        dispatcher_id = int(did_text) if did_text else None
    except ValueError:
        return _fail_start(f"PEPSI_DISPATCHER_ID is not an integer: {did_text!r}")

    # Protect the protocol: answers go to a private copy of stdout; fd 1 and
    # sys.stdout now point at stderr, fd 0 and sys.stdin at /dev/null.
    answer_fd = os.dup(1)
    input_fd = os.dup(0)
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout = sys.stderr
    sys.stdin = open(os.devnull)  # noqa: SIM115

    from pepsi_dispatch.config import ConfigError

    try:
        _, config_name, dsn = _load_graph(args.config, None)
    except ConfigError as exc:
        return _fail_start(str(exc))
    dsn = os.environ.get("PEPSI_DSN") or dsn

    def connect() -> psycopg.Connection:
        return psycopg.connect(dsn, autocommit=True, application_name=f"pepsi-worker {stage}")

    try:
        conn = connect()
    except psycopg.OperationalError as exc:
        print(f"pepsi worker: cannot connect to the database: {exc}", file=sys.stderr)
        return EX_TEMPFAIL
    except psycopg.Error as exc:
        print(f"pepsi worker: cannot connect to the database: {exc}", file=sys.stderr)
        return 1
    try:
        try:
            successors, config_name, _ = _load_graph(args.config, conn)
        except ConfigError as exc:
            return _fail_start(str(exc))
        except (psycopg.errors.UndefinedFunction, psycopg.errors.InvalidSchemaName):
            return _fail_start(
                "the database lacks pepsi.stage_config(): it is not migrated to the SDK's"
                " schema; run 'alembic upgrade head' with PEPSI_DSN set"
            )
        if successors is None or stage not in successors:
            # Every message would fail on its transition: touch none of them.
            _fail_start(
                f"stage {stage} is not in the configuration ({config_name}); start the"
                " worker with the dispatcher's file (PEPSI_CONFIG or -c)"
            )
            return EXIT_NO_STAGE
        worker = _Worker(
            handlers,
            stage,
            conn,
            dispatcher_id,
            successors,
            config_name,
            group_commit,
            answer_fd,
            input_fd,
            connect,
            _retry_stages(conn),
        )
        signal.signal(signal.SIGTERM, worker.on_signal)
        signal.signal(signal.SIGINT, worker.on_signal)
        try:
            return worker.serve()
        except psycopg.OperationalError as exc:
            # Reconnecting gave up: the batch in hand was rolled back, nothing it
            # held is done. EX_TEMPFAIL tells the dispatcher to release, not fail.
            print(
                f"pepsi worker: database connection lost, reconnecting gave up: {exc};"
                f" exiting {EX_TEMPFAIL}",
                file=sys.stderr,
            )
            return EX_TEMPFAIL
        finally:
            conn = worker.conn
    finally:
        try:
            conn.close()
        except Exception:
            pass
