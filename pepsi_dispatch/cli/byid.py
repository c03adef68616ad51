"""``pepsi-queue cancel --id`` / ``requeue --id``: act on each id and say which ones.

The SQL functions (``pepsi.cancel``, ``pepsi.requeue_failed``) return a count for
their whole selection. To know *which* ids were acted on, the command calls the
function once per id (one pipelined batch, one transaction), so an id reported as
done is one whose own call moved it, never a guess made from its status afterwards
(a cancelled message is ``failed`` then, a requeued one ``pending``). Each id that
was not acted on is then explained from what ``pepsi.message_story`` says of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

__all__ = ["CANCEL", "REQUEUE", "Action", "Outcome", "act_on_ids", "summary", "why_not"]


@dataclass(frozen=True)
class Action:
    """One per-id operator action: its SQL call and the statuses it acts on."""

    verb: str  # "cancel", "requeue": the error lines' prefix
    past: str  # "cancelled", "requeued": the summary line's first word
    sql: str  # one id as %(ids)s (a one-element array), the stage as %(stage)s
    statuses: tuple[str, ...]
    wanted: str  # those statuses, as the error line names them


CANCEL = Action(
    "cancel",
    "cancelled",
    "SELECT pepsi.cancel(%(ids)s, %(stage)s)",
    ("pending", "paused"),
    "pending or paused",
)
REQUEUE = Action(
    "requeue",
    "requeued",
    "SELECT pepsi.requeue_failed(%(stage)s, %(ids)s)",
    ("failed", "timeout", "expired"),
    "failed, timeout or expired",
)


@dataclass
class Outcome:
    """What a per-id action did: the ids acted on, and one reason per other id."""

    done: list[int]
    refused: list[str]


def summary(action: Action, done: Sequence[int]) -> str:
    """The stdout line of an ``--id`` action: how many, and which ids, were acted on."""
    ids = ", ".join(map(str, done))
    return f"{action.past} {len(done)} message(s)" + (f": {ids}" if ids else "")


def act_on_ids(
    conn: psycopg.Connection, action: Action, ids: Sequence[int], stage: str | None
) -> Outcome:
    """Run ``action`` for each distinct id (ascending, one transaction); say what happened."""
    wanted = sorted(set(ids))
    if not wanted:
        return Outcome([], [])
    params = [{"ids": [mid], "stage": stage} for mid in wanted]
    counts: list[int] = []
    with conn.transaction():
        cur = conn.cursor()
        cur.executemany(action.sql, params, returning=True)
        while True:
            row = cur.fetchone()
            counts.append(int(row[0]) if row else 0)
            if not cur.nextset():
                break
    moved = dict(zip(wanted, counts, strict=True))
    done = [mid for mid in wanted if moved[mid] > 0]
    refused = [why_not(conn, action, mid, stage) for mid in wanted if moved[mid] == 0]
    return Outcome(done, refused)


def why_not(conn: psycopg.Connection, action: Action, mid: int, stage: str | None) -> str:
    """Why ``action`` left message ``mid`` alone, as one error line (verb first)."""
    cur = conn.execute("SELECT status, stage, dedupe_key FROM pepsi.message_story(%s)", (mid,))
    return f"{action.verb}: {_reason(action, mid, stage, cur.fetchone())}"


def _reason(action: Action, mid: int, stage: str | None, row: Any) -> str:
    if row is None:
        return f"no message {mid}"
    status, at, dedupe_key = row
    if status not in action.statuses:
        return f"message {mid} is {status}, not {action.wanted}"
    if stage is not None and at != stage:
        return f"message {mid} is at stage {at}, not {stage}"
    if action is REQUEUE and dedupe_key is not None:
        return (
            f"message {mid} keeps its {status} status: its dedupe key {dedupe_key!r} is carried"
            " by a pending, running or paused message"
        )
    return f"message {mid} was not {action.past} (it changed meanwhile; try again)"
