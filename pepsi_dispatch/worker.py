"""SDK for stage programs written in Python: the worker side of the pipe protocol
(docs/WORKERS.md).

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
* Group commit: the ids already waiting on stdin are processed in one
  transaction (a savepoint per message, so one failure rolls back only its own
  message), committed once, then all answered. It is the default when the
  dispatcher offers the in-hand slot (``PEPSI_INHAND_FD``): the SDK keeps there
  the id of the message whose handler runs, so a crash the SDK cannot see
  (a signal, the OOM killer, ``os._exit``) fails only that message. Without
  the slot the default is one commit per message; ``group_commit=True`` or
  ``False`` forces either. A statement that fails inside a group (a NUL in a
  string of ``msg.state``, say) makes the SDK redo that batch one message at a
  time: only the message whose statement fails fails.
* EOF on stdin: exit 0. SIGTERM/SIGINT: finish the message in hand, answer it, exit 0.

Nothing but answers is ever written to the protocol's stdout: at start the SDK
moves the real stdout aside and points file descriptor 1 and ``sys.stdout`` at
stderr, so ``print()`` in a handler (or a child process) lands in the
dispatcher's log. Likewise stdin is replaced by ``/dev/null`` for handlers.

This module is the stable import path; the SDK's parts live in
:mod:`pepsi_dispatch.sdk` (see docs/INTERNALS.md, "The SDK").
"""

from __future__ import annotations

# Public constants of this module before the split, still importable from here.
from pepsi_dispatch.sdk.connection import EX_TEMPFAIL as EX_TEMPFAIL
from pepsi_dispatch.sdk.connection import RECONNECT_TIMEOUT as RECONNECT_TIMEOUT
from pepsi_dispatch.sdk.entry import fork_point, leave, run
from pepsi_dispatch.sdk.lending import connect
from pepsi_dispatch.sdk.message import (
    Advance,
    Fail,
    Finish,
    Handler,
    Message,
    Pause,
    Transition,
)
from pepsi_dispatch.sdk.pipe import MAX_REASON as MAX_REASON

__all__ = [
    "Advance",
    "Fail",
    "Finish",
    "Handler",
    "Message",
    "Pause",
    "Transition",
    "connect",
    "fork_point",
    "leave",
    "run",
]
