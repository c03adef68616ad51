"""What each drain asked of the queue's SQL functions, per message.

When the bench's database tracks function calls (``ALTER DATABASE … SET
track_functions = 'pl'``, as a superuser; off by default, and it costs a little
on every call), each throughput run reads ``pg_stat_user_functions`` for the
``pepsi`` schema before the dispatcher starts and after every session of the
drain has ended, and prints, per message drained, how often each function ran
and its own time (``self_time``: the time inside it, SQL it runs included,
less the time in other tracked functions it called; wall time, not CPU).
PostgreSQL 15 writes a backend's statistics before it leaves
``pg_stat_activity``, so once no session of the drain is listed, its calls
are all counted.

That is how the claim's cost with competing replicas is measured: the same
drain with one, two and four dispatchers, and how many claims each message
took, how long each claim ran, and how much of that is the claim itself.
Nothing is printed on a database that does not track functions.
"""

from __future__ import annotations

from typing import NamedTuple

import psycopg

__all__ = ["Calls", "delta", "line", "snapshot", "tracking"]


class Calls(NamedTuple):
    """A function's counters: calls, and its own time in milliseconds."""

    calls: int
    self_ms: float


def tracking(conn: psycopg.Connection) -> bool:
    """Does this database count calls of PL/pgSQL functions?"""
    row = conn.execute("SHOW track_functions").fetchone()
    return row is not None and row[0] in ("pl", "all")


def snapshot(conn: psycopg.Connection) -> dict[str, Calls]:
    """The ``pepsi`` functions' counters now (summed over their overloads)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    rows = conn.execute(
        "SELECT funcname, sum(calls)::bigint, sum(self_time)::float8"
        " FROM pg_stat_user_functions WHERE schemaname = 'pepsi' GROUP BY funcname"
    ).fetchall()
    return {name: Calls(int(calls), float(self_ms)) for name, calls, self_ms in rows}


def delta(before: dict[str, Calls], after: dict[str, Calls]) -> dict[str, Calls]:
    """What ran between two snapshots, the functions that ran only."""
    out = {}
    for name, now in after.items():
        was = before.get(name, Calls(0, 0.0))
        if now.calls > was.calls:
            out[name] = Calls(now.calls - was.calls, now.self_ms - was.self_ms)
    return out


def line(ran: dict[str, Calls], messages: int, top: int = 6) -> str:
    """One line: the functions that took the most time, per message."""
    if not ran or messages <= 0:
        return "      functions: none counted"
    busiest = sorted(ran.items(), key=lambda kv: kv[1].self_ms, reverse=True)[:top]
    parts = [
        f"{name} {c.calls / messages:.3f} calls, {c.self_ms * 1e3 / messages:.0f} µs"
        f" ({c.self_ms * 1e3 / c.calls:.0f} µs a call)"
        for name, c in busiest
    ]
    return "      functions per message (own time): " + "; ".join(parts)
