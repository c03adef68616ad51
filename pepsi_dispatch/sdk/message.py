"""What a handler sees (:class:`Message`) and what it returns (a :class:`Transition`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

import psycopg

__all__ = [
    "Advance",
    "DatabaseAccess",
    "Fail",
    "Finish",
    "Handler",
    "Message",
    "Pause",
    "Refused",
    "Transition",
]


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


class DatabaseAccess(Protocol):
    """What ``msg.db`` opens: the message's own transaction level on the connection."""

    conn: psycopg.Connection

    def enter(self) -> None:
        """Open the level (a transaction or savepoint), once."""


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
    _scope: DatabaseAccess | None = field(default=None, repr=False, compare=False)

    @property
    def db(self) -> psycopg.Connection:
        """The worker's connection, inside this message's transaction."""
        if self._scope is None:
            raise RuntimeError("this message is not being processed")
        self._scope.enter()
        return self._scope.conn


Handler = Callable[[Message], Transition | None]


class Refused(Exception):
    """The handler asked for a transition that is not allowed (the message fails)."""
