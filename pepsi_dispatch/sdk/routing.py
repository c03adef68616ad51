"""Handler routing: one message through this program's handlers, to its answer line.

:meth:`HandlerDispatch.process` checks the row is ours, runs the handler of its
stage (and, after ``Advance(to, fuse=True)``, of the stages it fuses into),
turns each result into statements written through the message's
:class:`~.transaction.Scope`, and returns the answer line. A handler that
raises or asks for something not allowed fails its message, not the worker.
"""

from __future__ import annotations

import copy
import json
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

import psycopg
from psycopg import pq

from .loading import Loaded
from .message import Advance, Fail, Finish, Handler, Message, Pause, Refused, Transition
from .pipe import exc_reason, one_line
from .statements import Statement, Statements
from .transaction import (
    GONE_ERRORS,
    BatchFailed,
    CommitMode,
    HandlerScope,
    Role,
    RowLost,
    Scope,
    TransactionEnded,
)

__all__ = ["ENDS_NO_TRANSACTION", "Attempt", "HandlerDispatch", "StageGraph", "state_patch"]

#: Why a handler that commits or rolls back the transaction it runs in fails.
ENDS_NO_TRANSACTION = (
    "a handler may not commit or roll back the transaction it runs in (its batch's,"
    " with group commit): what it executes on msg.db commits with its message's"
    " transition, and is rolled back if it raises"
)

#: The start of psycopg's refusal of ``commit()`` / ``rollback()`` inside a
#: transaction block (msg.db is always in one): method name -> text.
_REFUSED_CALLS = {
    "commit": "Explicit commit() forbidden within a Transaction",
    "rollback": "Explicit rollback() forbidden within a Transaction",
}


class Attempt(Enum):
    """Whether a message is processed for the first time or redone."""

    FIRST = "first time"
    REDO = "redone after a lost connection: our commit may have gone through unanswered"


def state_patch(original: dict[str, Any], state: dict[str, Any]) -> str | None:
    """The top-level keys of ``state`` that changed, as JSON text (None: nothing changed).

    ``dispatch_error`` is the dispatcher's; a handler cannot set it.
    """
    patch = {k: v for k, v in state.items() if k not in original or original[k] != v}
    patch.pop("dispatch_error", None)
    try:
        return json.dumps(patch) if patch else None
    except (TypeError, ValueError) as exc:
        raise Refused(f"msg.state cannot be stored as JSON: {exc}") from None


@dataclass(frozen=True)
class StageGraph:
    """The stage graph the worker checks transitions against (None: unknown)."""

    successors: dict[str, tuple[str, ...]] | None
    config_name: str
    #: stage -> what None means there, once worked out (transitions are immutable)
    _defaults: dict[str, Transition] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def check(self, stage: str, result: Any) -> Transition:
        """The transition a handler's result means; :class:`Refused` when not allowed."""
        if result is None:
            default = self._defaults.get(stage)
            if default is None:
                default = self._defaults[stage] = self._default(stage, self._allowed(stage))
            return default
        allowed = self._allowed(stage)
        if isinstance(result, (Finish, Pause, Fail)):
            return result
        if isinstance(result, Advance):
            self._check_advance(stage, result, allowed)
            return result
        raise Refused(
            f"handler of stage {stage} returned {type(result).__name__}, not a transition;"
            " return Advance, Finish, Pause, Fail or None"
        )

    def _allowed(self, stage: str) -> tuple[str, ...] | None:
        return None if self.successors is None else self.successors.get(stage)

    def _default(self, stage: str, allowed: tuple[str, ...] | None) -> Transition:
        if allowed is None:
            raise Refused(
                f"handler of stage {stage} returned None, and stage {stage} is not in the"
                f" configuration ({self.config_name}); return Advance(...) or Finish()"
            )
        if not allowed:
            return Finish()
        if len(allowed) == 1:
            return Advance(allowed[0])
        raise Refused(
            f"handler of stage {stage} returned None, but stage {stage} has several"
            f" successors ({', '.join(allowed)}); return Advance(name)"
        )

    def _check_advance(self, stage: str, advance: Advance, allowed: tuple[str, ...] | None) -> None:
        if allowed is None:
            raise Refused(
                f"stage {stage} cannot advance to {advance.to}: stage {stage} is not in the"
                f" configuration ({self.config_name}), so its successors are unknown"
            )
        if advance.to not in allowed:
            if allowed:
                which = "allowed successors: " + ", ".join(allowed)
            else:
                which = f"{stage} is a final stage (no NEXT)"
            raise Refused(
                f"stage {stage} may not advance to {advance.to} ({which};"
                f" NEXT of [stage-{stage}] in {self.config_name})"
            )


@dataclass
class _Pass:
    """One message's pass through this program's handlers (a fused hop adds a stage)."""

    message_id: int
    payload: Any
    state: dict[str, Any]
    retries: int
    #: stages run in this pass, the current one last
    path: list[str] = field(default_factory=list)

    @property
    def stage(self) -> str:
        return self.path[-1]

    @property
    def prefix(self) -> str:
        """Put before a failure's reason: after a hop it names the stage."""
        return f"[{self.stage}] " if len(self.path) > 1 else ""

    def hop(self, to: str) -> None:
        self.path.append(to)
        self.retries = 0


class _Step(NamedTuple):
    """What one handler's result asks for (a tuple: made once per handler call)."""

    transition: Transition
    patch_json: str | None
    #: the stage to run next in this pass (a fused advance), or None
    fuse_to: str | None
    #: the message's last statement, unless it fuses on
    final: Statement | None


class HandlerDispatch:
    """Calls the handlers of this program for the messages of ``stage``."""

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        stage: str,
        graph: StageGraph,
        statements: Statements,
        retry_stages: frozenset[str] = frozenset(),
    ) -> None:
        self.handlers = dict(handlers)
        self.stage = stage
        self.graph = graph
        self.statements = statements
        #: stages with automatic retries: a handler exception there is left to
        #: the dispatcher (record_dispatch_error retries or fails it).
        self.retry_stages = retry_stages
        #: the database keeps a handler's traceback in the message's history
        #: (pepsi.note_traceback): it is stored there, not printed to stderr.
        self.keeps_tracebacks = False

    def process(self, loaded: Loaded, scope: Scope, attempt: Attempt = Attempt.FIRST) -> str:
        """Process one input line; its answer line (the scope is left to commit)."""
        line, message_id, row = loaded
        if message_id is None:
            return f"1 not a message id: {one_line(line.decode(errors='replace'))}"
        if row is None:
            return f"1 message {message_id} does not exist"
        _, stage, status, payload, state, retries = row
        if status != "running" or stage != self.stage:
            return self._not_running(message_id, stage, status, attempt)
        run = _Pass(message_id, payload, dict(state or {}), retries, [stage])
        try:
            return self._run_stages(run, scope)
        except TransactionEnded as ended:
            ended.answer = self._transaction_ended(run, scope)
            if scope.mode is CommitMode.GROUP:
                raise  # the batch's transaction is gone: the runner settles the batch
            return ended.answer
        except RowLost as exc:
            scope.rollback_to(0)
            print(f"pepsi worker: {exc}", file=sys.stderr)
            return f"1 {one_line(str(exc))}"
        except psycopg.Error as exc:
            if scope.conn.broken:
                raise  # a lost connection: the runner reconnects and redoes the message
            if isinstance(exc, GONE_ERRORS):
                # a level's savepoint is gone: the handler's COMMIT AND CHAIN (or
                # COMMIT; BEGIN) ended the transaction and began another
                ended = TransactionEnded(self._transaction_ended(run, scope))
                if scope.mode is CommitMode.GROUP:
                    raise ended from None
                return ended.answer or ""
            return self._database_error(exc, message_id, stage, scope)

    def _transaction_ended(self, run: _Pass, scope: Scope) -> str:
        """A handler ended the transaction its message runs in: roll back what is
        open now, fail the message (on its own, committed at once), its answer.
        What the handler wrote before its COMMIT stays committed; nothing of its
        message's transition was. A message failed so is not retried (running
        it again would commit that part again)."""
        scope.abandon()
        reason = one_line(
            f"{run.prefix}handler of stage {run.stage} ended its transaction"
            f" (COMMIT or ROLLBACK on msg.db): {ENDS_NO_TRANSACTION}"
        )
        print(f"pepsi worker: message {run.message_id}: {reason}", file=sys.stderr)
        alone = Scope(scope.conn)  # one statement in autocommit
        for stage in dict.fromkeys((run.stage, run.path[0])):  # a hop may be undone
            try:
                alone.write(self.statements.fail(run.message_id, stage, reason), Role.LAST)
                break
            except RowLost:
                continue
        return f"1 {reason}"

    def _not_running(self, message_id: int, stage: str, status: str, attempt: Attempt) -> str:
        if attempt is Attempt.REDO and stage == self.stage and status == "pending":
            # None of our transitions leaves the row pending at our own stage: our
            # commit did not go through, and the claim itself was lost (a database
            # restarted or failed over before the claim was on disk or on the
            # standby). The row runs again elsewhere; "0" would count a success
            # that did not happen. Nothing is written (not ours to fail).
            reason = (
                f"message {message_id} is pending at stage {stage} again: its claim was"
                " lost with the connection (a database restart or failover); not run here"
            )
            print(f"pepsi worker: {reason}", file=sys.stderr)
            return f"1 {reason}"
        if attempt is Attempt.REDO:
            # Redone after a lost connection: our commit went through, its
            # acknowledgement was lost. The row has moved on; nothing to do.
            print(
                f"pepsi worker: message {message_id} already moved on ({status} at stage"
                f" {stage}) before the connection was lost",
                file=sys.stderr,
            )
            return "0"
        return (
            f"1 message {message_id} is not running at stage {self.stage}"
            f" (it is {status} at stage {stage})"
        )

    def _database_error(self, exc: psycopg.Error, message_id: int, stage: str, scope: Scope) -> str:
        """A statement of this message failed: undo all of it, then fail the row
        where it was (at the stage it was handed to us)."""
        scope.rollback_to(0)
        if (
            scope.mode is CommitMode.GROUP
            and scope.conn.info.transaction_status == pq.TransactionStatus.INERROR
        ):
            # no savepoint of this message to roll back to: the batch is lost
            raise BatchFailed(f"group commit batch failed: {exc_reason(exc)}") from exc
        reason = one_line(f"database error: {exc_reason(exc)}")
        print(f"pepsi worker: message {message_id}: {reason}", file=sys.stderr)
        try:
            scope.write(self.statements.fail(message_id, stage, reason), Role.LAST)
            scope.commit()
        except RowLost:
            scope.rollback_to(0)
        return f"1 {reason}"

    def _run_stages(self, run: _Pass, scope: Scope) -> str:
        """Run handlers until one result does not fuse on; write its statements."""
        while True:
            step = self._run_handler(run, scope)
            if isinstance(step, str):
                return step  # the handler failed; its message is settled
            stage = run.stage
            if step.patch_json is not None:
                statement = self.statements.set_state(run.message_id, stage, step.patch_json)
                scope.write(statement, Role.STEP)
            if step.fuse_to is None:
                break
            scope.write(self.statements.hop(run.message_id, stage, step.fuse_to), Role.STEP)
            run.hop(step.fuse_to)
        assert step.final is not None
        scope.write(step.final, Role.LAST)
        scope.commit()
        if isinstance(step.transition, Fail):
            return f"1 {one_line(run.prefix + str(step.transition.reason))}"
        if len(run.path) > 1:
            return "0 fused=" + ",".join(run.path[1:])
        return "0"

    def _run_handler(self, run: _Pass, scope: Scope) -> _Step | str:
        """Call the handler of the current stage: its step, or the answer when it failed."""
        base = scope.depth
        path = run.path
        stage = path[-1]
        original = copy.deepcopy(run.state) if run.state else {}  # nested values may be mutated
        fused_from = tuple(path[:-1]) if len(path) > 1 else ()
        access = HandlerScope(scope)
        msg = Message(
            run.message_id, stage, run.payload, run.state, run.retries, fused_from, access
        )
        try:  # everything up to the step: what raises here fails the message
            handler = self.handlers.get(stage)
            if handler is None:
                raise LookupError(f"this program has no handler for stage {stage}")
            saved = sys.stdout
            try:
                result = handler(msg)
            finally:
                sys.stdout = saved
                if scope.ended():
                    raise TransactionEnded  # (passes ``except Exception`` below)
            return self._step(run, stage, self.graph.check(stage, result), original, msg.state)
        except Exception as exc:  # the handler failed: this message fails, we live on
            return self._handler_failed(run, exc, scope, base)

    def _step(
        self,
        run: _Pass,
        stage: str,
        transition: Transition,
        original: dict[str, Any],
        state: dict[str, Any],
    ) -> _Step:
        """What a handler's (checked) result and its ``msg.state`` ask for."""
        # An empty dict changed nothing (state_patch would say None); anything
        # else, even an odd value put in msg.state, goes through state_patch.
        patch_json = None if type(state) is dict and not state else state_patch(original, state)
        fuse_to = None
        final = None
        if isinstance(transition, Advance) and transition.fuse and transition.to in self.handlers:
            fuse_to = transition.to
        else:
            final = self.statements.transition(run.message_id, stage, transition, run.prefix)
        run.state = state
        return _Step(transition, patch_json, fuse_to, final)

    def _handler_failed(self, run: _Pass, exc: Exception, scope: Scope, base: int) -> str:
        """Undo what the handler wrote, fail the message (unless the dispatcher
        retries it), commit; the answer."""
        trace = None
        called = _refused_call(exc)
        if called is not None:
            # psycopg refused msg.db.commit() / rollback(): nothing ended, but the
            # handler meant to; said plainly, and never retried (it would again)
            exc = Refused(
                f"handler of stage {run.stage} called msg.db.{called}(): {ENDS_NO_TRANSACTION}"
            )
        if isinstance(exc, Refused):
            reason = one_line(run.prefix + str(exc))
            print(f"pepsi worker: message {run.message_id}: {reason}", file=sys.stderr)
        else:
            reason = one_line(run.prefix + exc_reason(exc))
            if self.keeps_tracebacks:
                trace = "".join(traceback.format_exception(exc))
                print(
                    f"pepsi worker: message {run.message_id}: {reason} (traceback:"
                    f" pepsi-queue show {run.message_id})",
                    file=sys.stderr,
                )
            else:
                traceback.print_exception(exc, file=sys.stderr)
        had_levels = scope.depth > base
        scope.rollback_to(base)  # undo what this stage's handler wrote
        if had_levels and scope.conn.info.transaction_status == pq.TransactionStatus.INERROR:
            # rolling back to its savepoint failed: the handler's COMMIT AND
            # CHAIN (or COMMIT; BEGIN) ended the transaction, then it raised
            raise TransactionEnded
        if trace is not None:
            scope.write(self.statements.note_traceback(run.message_id, run.stage, trace), Role.STEP)
        if run.stage not in self.retry_stages or isinstance(exc, Refused):
            scope.write(self.statements.fail(run.message_id, run.stage, reason), Role.LAST)
        scope.commit()
        return f"1 {reason}"


def _refused_call(exc: Exception) -> str | None:
    """``commit`` or ``rollback`` when ``exc`` is psycopg refusing that call on
    a connection inside a transaction block, else None."""
    if isinstance(exc, psycopg.ProgrammingError):
        text = str(exc)
        for name, refusal in _REFUSED_CALLS.items():
            if text.startswith(refusal):
                return name
    return None
