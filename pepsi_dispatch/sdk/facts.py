"""What a worker asks the database once, as it starts: the configuration
overlay, the stages that retry, and which of the SDK's functions this role may
call. All in one round trip (:func:`start_facts`), because a worker forked from
its stage's template is otherwise ready in a few milliseconds, and each extra
statement on a new backend costs about a millisecond of CPU on both sides,
paid again by every recycled worker.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from .pinning import PIN_SIGNATURE
from .statements import NOTE_TRACEBACK, SET_BASED_FUNCTIONS

__all__ = [
    "StartFacts",
    "may_call",
    "overlay_rows",
    "retry_stages",
    "set_based_kinds",
    "start_facts",
]

#: SQL true when the function whose signature is ``{sig}`` exists and this role may run it.
_CALLABLE = (
    "to_regprocedure({sig}) IS NOT NULL"
    " AND has_function_privilege(to_regprocedure({sig}), 'EXECUTE')"
)
_KINDS, _SIGNATURES = (list(c) for c in zip(*SET_BASED_FUNCTIONS.items(), strict=True))

#: The overlay's rows (section, option, value) in the order stage_config()
#: gives them, the stages with RETRY_DELAY, whether note_traceback() may be
#: called, the transition kinds whose set-based function may be called, and
#: whether pin_messages() may be called.
_START_FACTS = f"""
SELECT ARRAY(SELECT ARRAY[c.section, c.option, c.value]
               FROM pepsi.stage_config() WITH ORDINALITY AS c(section, option, value, n)
              ORDER BY c.n),
       ARRAY(SELECT r.stage FROM pepsi.registered_stages() AS r
              WHERE r.retry_delay IS NOT NULL),
       {_CALLABLE.format(sig="%(tb)s")},
       ARRAY(SELECT f.k FROM unnest(%(kinds)s::text[], %(sigs)s::text[]) AS f(k, sig)
              WHERE {_CALLABLE.format(sig="f.sig")}),
       {_CALLABLE.format(sig="%(pin)s")}
"""


@dataclass(frozen=True)
class StartFacts:
    """What the database says to a starting worker."""

    #: ``pepsi.config`` rows for the stage graph: (section, option, value)
    overlay: list[tuple[str, str, str | None]]
    #: registered stages with automatic retries (RETRY_DELAY)
    retry_stages: frozenset[str]
    #: this role may call ``pepsi.note_traceback``
    keeps_tracebacks: bool
    #: transition kinds sent through a set-based function (group commit)
    set_based: frozenset[str]
    #: this role may call ``pepsi.pin_messages`` (the check before a handler starts)
    pins: bool = False


def start_facts(conn: psycopg.Connection) -> StartFacts:
    """The facts in one statement; on a database that cannot answer it (not
    migrated as far as this SDK, or a role without some privilege), one
    question at a time, each with its own fallback.

    Raises what :func:`overlay_rows` raises when the overlay cannot be read.
    """
    params = {"tb": NOTE_TRACEBACK, "kinds": _KINDS, "sigs": _SIGNATURES, "pin": PIN_SIGNATURE}
    try:
        row = conn.execute(_START_FACTS, params).fetchone()
    except psycopg.Error as exc:
        if conn.broken or isinstance(exc, psycopg.OperationalError):
            raise
        return StartFacts(
            overlay_rows(conn),
            retry_stages(conn),
            may_call(conn, NOTE_TRACEBACK),
            set_based_kinds(conn),
            may_call(conn, PIN_SIGNATURE),
        )
    assert row is not None
    overlay, retrying, keeps_tracebacks, set_based, pins = row
    return StartFacts(
        [(r[0], r[1], r[2]) for r in overlay],
        frozenset(retrying),
        bool(keeps_tracebacks),
        frozenset(set_based),
        bool(pins),
    )


def overlay_rows(conn: psycopg.Connection) -> list[tuple[str, str, str | None]]:
    """The configuration overlay's stage rows (``pepsi.stage_config()``)."""
    rows = conn.execute("SELECT section, option, value FROM pepsi.stage_config()").fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def retry_stages(conn: psycopg.Connection) -> frozenset[str]:
    """Registered stages with automatic retries (RETRY_DELAY); none before migration 0009."""
    try:
        rows = conn.execute(
            "SELECT stage FROM pepsi.registered_stages() WHERE retry_delay IS NOT NULL"
        ).fetchall()
    except (psycopg.errors.UndefinedFunction, psycopg.errors.InsufficientPrivilege):
        return frozenset()
    return frozenset(r[0] for r in rows)


def may_call(conn: psycopg.Connection, signature: str) -> bool:
    """The database has the function ``signature`` and this role may run it."""
    row = conn.execute("SELECT " + _CALLABLE.format(sig="%(sig)s"), {"sig": signature}).fetchone()
    return bool(row and row[0])


def set_based_kinds(conn: psycopg.Connection) -> frozenset[str]:
    """The transition kinds whose set-based function the database has and this role
    may run. A worker of a newer package on a database not yet migrated (the window
    of an upgrade) then sends those transitions row by row instead of failing its
    batches."""
    rows = conn.execute(
        "SELECT f.k FROM unnest(%s::text[], %s::text[]) AS f(k, sig) WHERE "
        + _CALLABLE.format(sig="f.sig"),
        (_KINDS, _SIGNATURES),
    ).fetchall()
    return frozenset(r[0] for r in rows)
