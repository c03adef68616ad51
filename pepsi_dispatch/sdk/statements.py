"""The statements of the SQL API the SDK sends, and the ones a transition becomes.

Every call names the row's stage and the dispatcher id (the fencing token); it
returns false, changing nothing, when the row is no longer running at that
stage under that dispatcher.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, NamedTuple

from psycopg.types.json import Jsonb

from .message import Advance, Finish, Pause, Refused, Transition
from .pipe import one_line

__all__ = [
    "ADVANCE_MANY",
    "FINISH_MANY",
    "MANY",
    "NOTE_TRACEBACK",
    "SET_BASED_FUNCTIONS",
    "SINGLE",
    "Statement",
    "Statements",
    "lost_text",
]

# Each call with the types of its parameters; below, the same call as one
# statement, and over arrays (group commit: many messages' calls in one statement).
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
    "note_traceback": (
        "pepsi.note_traceback({0}, {1}, {2}, {3})",
        ("bigint", "text", "text", "bigint"),
    ),
}
#: A failure's traceback goes to the message's history (migration 0018).
NOTE_TRACEBACK = "pepsi.note_traceback(bigint, text, text, bigint)"
#: kind -> ``SELECT call(%s, ...)``: one boolean.
SINGLE = {
    kind: "SELECT " + call.format(*(f"%s::{t}" for t in types))
    for kind, (call, types) in _CALLS.items()
}
#: kind -> the call over parallel arrays (one per parameter): one boolean per row, in order.
MANY = {
    kind: "SELECT "
    + call.format(*(f"u.a{i}" for i in range(len(types))))
    + " FROM unnest("
    + ", ".join(f"%s::{t}[]" for t in types)
    + ") WITH ORDINALITY AS u("
    + ", ".join(f"a{i}" for i in range(len(types)))
    + ", n) ORDER BY u.n"
    for kind, (call, types) in _CALLS.items()
}

#: Finishes several rows of one stage in one set-based UPDATE (not one PL/pgSQL
#: call and UPDATE per row): the ids it changed.
FINISH_MANY = "SELECT pepsi.finish_many(%s::bigint[], %s::text, %s::bigint)"
#: The same for advances of one stage to one stage (migration 0015).
ADVANCE_MANY = "SELECT pepsi.advance_many(%s::bigint[], %s::text, %s::text, %s::bigint)"
#: kind -> the set-based function group commit uses for it, when the database has it
#: (finish_many since migration 0011, advance_many since 0015).
SET_BASED_FUNCTIONS = {
    "finish": "pepsi.finish_many(bigint[], text, bigint)",
    "advance": "pepsi.advance_many(bigint[], text, text, bigint)",
}


def lost_text(what: str, message_id: int, stage: str, dispatcher_id: int | None) -> str:
    """The error of a ``what`` (``advance``, ``pause``, ...) that changed nothing."""
    holder = f" under dispatcher {dispatcher_id}" if dispatcher_id is not None else ""
    return (
        f"{what} of message {message_id} changed nothing: it is no longer running at stage"
        f" {stage}{holder} (the dispatcher may have timed it out or requeued it)"
    )


class Statement(NamedTuple):
    """One call of the SQL API about one message.

    :attr:`lost` is the error to report when the call changes nothing (the row
    is no longer ours): ``given_lost`` as given, or else, for the statements
    :class:`Statements` builds, formatted from ``what`` and the parameters when
    it is asked for (rarely: only a lost row needs it). (An immutable tuple,
    not a frozen dataclass: one or more is made per message, and a tuple is
    made faster.) Its equality is the tuple's: it compares how the error is
    given, not the text :attr:`lost` makes of it.
    """

    kind: str
    params: tuple[Any, ...]
    given_lost: str | None = None
    #: what the call is, as its error names it (``advance``, ``pause``, ...)
    what: str = ""

    @property
    def message_id(self) -> int:
        """The message the call is about (its first parameter)."""
        return self.params[0]

    @property
    def lost(self) -> str:
        """The error when the call changed nothing."""
        if self.given_lost is not None:
            return self.given_lost
        params = self.params  # (message_id, stage, ..., dispatcher_id)
        return lost_text(self.what, params[0], params[1], params[-1])


def _as_is(text: str) -> str:
    """Jsonb ``dumps`` for text that is JSON already."""
    return text


class Statements:
    """Builds the statements about messages, fenced by ``dispatcher_id``."""

    def __init__(self, dispatcher_id: int | None) -> None:
        self.dispatcher_id = dispatcher_id

    def lost(self, message_id: int, stage: str, what: str) -> str:
        """The error of a ``what`` that changed nothing."""
        return lost_text(what, message_id, stage, self.dispatcher_id)

    def _make(self, kind: str, what: str, message_id: int, stage: str, *args: Any) -> Statement:
        # The error text is formatted only if it is needed (Statement.lost).
        return Statement(kind, (message_id, stage, *args, self.dispatcher_id), None, what)

    def fail(self, message_id: int, stage: str, reason: str) -> Statement:
        """Fail the message with ``reason`` (already one line)."""
        return self._make("fail", "fail", message_id, stage, reason)

    def note_traceback(self, message_id: int, stage: str, text: str) -> Statement:
        """Keep a handler's traceback for the message's history (only on failure)."""
        return self._make("note_traceback", "note_traceback", message_id, stage, text)

    def set_state(self, message_id: int, stage: str, patch_json: str) -> Statement:
        """Merge ``patch_json`` (a JSON object's text) into the row's state."""
        patch = Jsonb(patch_json, dumps=_as_is)
        return self._make("set_state", "set_state", message_id, stage, patch)

    def hop(self, message_id: int, stage: str, to: str) -> Statement:
        """Move the row on to ``to`` and keep it running (fusion)."""
        return self._make("hop", "hop", message_id, stage, to)

    def transition(
        self, message_id: int, stage: str, transition: Transition, prefix: str = ""
    ) -> Statement:
        """The statement of a handler's (checked) transition.

        ``prefix`` (``[stage] `` after a fused hop) goes before a failure's reason.
        Raises :class:`Refused` for a Pause whose ``when`` is no time.
        """
        if isinstance(transition, Advance):
            return self._make("advance", "advance", message_id, stage, transition.to)
        if isinstance(transition, Finish):
            return self._make("finish", "finish", message_id, stage)
        if isinstance(transition, Pause):
            return self._pause(message_id, stage, transition)
        return self.fail(message_id, stage, one_line(prefix + str(transition.reason)))

    def _pause(self, message_id: int, stage: str, pause: Pause) -> Statement:
        when = pause.when
        if isinstance(when, datetime):
            return self._make("pause_at", "pause", message_id, stage, when, pause.reason)
        if isinstance(when, timedelta):
            seconds = when.total_seconds()
        elif isinstance(when, (int, float)) and not isinstance(when, bool):
            seconds = float(when)
        else:
            raise Refused(
                f"Pause needs seconds, a timedelta or a datetime, not {type(when).__name__}"
            )
        return self._make("pause_in", "pause", message_id, stage, seconds, pause.reason)
