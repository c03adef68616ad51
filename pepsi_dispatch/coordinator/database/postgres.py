"""The dispatcher's store on PostgreSQL: :class:`PostgresStore`, the one
implementation of the port (:class:`~.port.DispatchStore`).

The loop uses exactly **two** autocommit connections, whatever DB_POOL_SIZE
says (it is an upper bound, and 2 is below every sensible value):

* the *listen* connection holds the session-level advisory lock that makes
  this dispatcher the only one (or, in competing mode, one of several) and
  LISTENs on ``workqueue`` and ``config_changed``; it runs no queue work, so
  a slow statement never delays a notification;
* the *work* connection runs every ``pepsi.*`` call, each one short statement
  in its own implicit transaction -- nothing is ever held open while the
  loop waits.

Every data decision is a ``pepsi.*`` function (``sql/functions/``); this module
holds the constant call strings, with named parameters (``%(name)s``) built
from each query's params type, and decodes what they return. The hot path,
:meth:`PostgresStore.round_trip`, sends up to four calls in one pipeline
(psycopg sends a named parameter as the $n of its first use, so the server
sees the positional statement): measured on the 2-core CI box against
a local PostgreSQL 15, three statements in one pipeline cost 94 µs against
61 µs for a single round trip, so batching a wake's writes roughly
halves its database time. A pipeline without explicit transaction is one
implicit transaction, so it commits all or nothing -- which is what makes
re-running it after an error safe.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, Final, TypeVar

import psycopg
from psycopg import errors as pgerrors
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pepsi_dispatch.backoff import Backoff
from pepsi_dispatch.config import StageConfig
from pepsi_dispatch.coordinator.database.port import (
    DELAYED,
    TRY_NOW,
    ClaimedRows,
    ClaimParams,
    Epoch,
    Failure,
    FiredTick,
    FireScheduleParams,
    RegisterSchedulesParams,
    Requeue,
    RequeueParams,
    RoundTripParams,
    RoundTripResult,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Key of the advisory lock that marks "a dispatcher serves this database".
#: Exclusive for a single dispatcher, shared for competing replicas, so the two
#: modes exclude each other. ASCII "pepsidsp" as a signed 64-bit integer.
LOCK_KEY: Final = int.from_bytes(b"pepsidsp", "big", signed=True)

CHANNELS: Final = ("workqueue", "config_changed")

#: Transient errors the retry helper re-runs (40001, 40P01).
TRANSIENT: Final = (pgerrors.SerializationFailure, pgerrors.DeadlockDetected)

#: libpq settings added unless the DSN sets them. Keepalives and
#: tcp_user_timeout (ms: unacknowledged data on a dead link) are ignored on Unix
#: sockets; connect_timeout bounds every (re)connect, so a reconnect to a host
#: that went silent cannot freeze the single-threaded loop.
KEEPALIVES: Final = {
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
    "tcp_user_timeout": "60000",
    "connect_timeout": "10",
}
SQL_SESSION_TIMEOUTS: Final = "SET statement_timeout = '60s'; SET lock_timeout = '10s'"
# When the server last started, and when it last came back from a crash (a
# crash restart re-initialises the shared statistics but keeps the postmaster's
# start time): it changes exactly when commits not yet flushed may be lost.
SQL_SERVER_EPOCH: Final = (
    "SELECT pg_postmaster_start_time()::text, (SELECT stats_reset FROM pg_stat_bgwriter)::text"
)

# -- the calls (the function names are the SQL API of docs/SQL.md) ------------
SQL_TRY_LOCK: Final = "SELECT pg_try_advisory_lock(%(key)s::bigint)"
SQL_TRY_LOCK_SHARED: Final = "SELECT pg_try_advisory_lock_shared(%(key)s::bigint)"
SQL_REGISTER: Final = (
    "SELECT pepsi.register_dispatcher(%(hostname)s::text, %(pid)s::int, %(competing)s::boolean)"
)
SQL_HEARTBEAT: Final = "SELECT pepsi.heartbeat(%(dispatcher_id)s::bigint)"
SQL_HEARTBEAT_GAUGES: Final = "SELECT pepsi.heartbeat(%(dispatcher_id)s::bigint, %(gauges)s::jsonb)"
SQL_REGISTERED: Final = "SELECT pepsi.dispatcher_registered(%(dispatcher_id)s::bigint)"
SQL_UNREGISTER: Final = "SELECT pepsi.unregister_dispatcher(%(dispatcher_id)s::bigint)"
SQL_RESET_ORPHANS: Final = (
    "SELECT pepsi.reset_orphans(%(dispatcher_id)s::bigint, %(competing)s::boolean,"
    " make_interval(secs => %(orphan_timeout)s::float8))"
)
SQL_REPLICAS_AWAY: Final = (
    "SELECT replica_id, hostname, pid FROM pepsi.replicas_away(%(dispatcher_id)s::bigint,"
    " make_interval(secs => %(orphan_timeout)s::float8))"
)
SQL_RELEASE: Final = "SELECT pepsi.release(%(dispatcher_id)s::bigint, %(ids)s::bigint[])"
# record_dispatch_error v3 returns the rows it changed with their new status:
# 'paused' is an automatic retry (the stage's RETRY_DELAY), not a failure.
SQL_RECORD_ERRORS: Final = (
    "SELECT workqueue_id, stage, status FROM pepsi.record_dispatch_error("
    "%(dispatcher_id)s::bigint, %(ids)s::bigint[], %(statuses)s::text[], %(reasons)s::text[])"
)
SQL_REGISTER_STAGES: Final = (
    "SELECT pepsi.register_stages(%(dispatcher_id)s::bigint, %(stages)s::text[],"
    " %(nexts)s::text[], %(max_retries)s::int[], %(retry_delays)s::interval[],"
    " %(retry_delays_max)s::interval[], %(parallelisms)s::int[], %(queue_limits)s::int[])"
)
SQL_CHECK_ANSWERED: Final = (
    "SELECT workqueue_id, stage FROM pepsi.check_answered(%(dispatcher_id)s::bigint,"
    " %(ids)s::bigint[])"
)
# statement_timestamp() comes along so the next-due timer is computed on the
# database's clock, immune to skew between this host and the server. A row
# paused until 'infinity' is never due: no timer (subtracting it would raise
# "cannot subtract infinite timestamps" and fail the whole round trip).
SQL_REQUEUE_DUE: Final = (
    "SELECT requeued, exhausted, expired,"
    " CASE WHEN isfinite(next_due) THEN next_due - statement_timestamp() END,"
    " exhausted_stages, exhausted_counts, expired_stages, expired_counts"
    " FROM pepsi.requeue_due(NULL, NULL, NULL, make_interval(secs => %(expiry)s::float8))"
)
SQL_PURGE: Final = (
    "SELECT pepsi.purge_done(make_interval(secs => %(retention)s::float8), %(batch)s::int)"
)
SQL_KEEP_DEAD_LETTERS: Final = "SELECT pepsi.keep_dead_letters(%(batch)s::int)"
SQL_REGISTER_SCHEDULES: Final = (
    "SELECT name, settled_through FROM pepsi.register_schedules("
    "%(names)s::text[], %(stages)s::text[], %(specs)s::text[], %(nexts)s::timestamptz[])"
)
SQL_FIRE_SCHEDULE: Final = (
    "SELECT tick, workqueue_id, inserted FROM pepsi.fire_schedule("
    "%(name)s, %(ticks)s::timestamptz[], %(stage)s, %(payload)s, %(priority)s::int,"
    " %(dedupe_key)s::text, %(next_tick)s::timestamptz)"
)
#: The flush and the gauges without the flushed deltas, in one statement (one
#: transaction): a reader adding the gauges' unflushed deltas to stage_stats
#: never counts a delta twice nor misses it.
SQL_FLUSH_STATS_AND_GAUGES: Final = (
    "SELECT pepsi.flush_stats(%(stages)s::text[], %(processed)s::bigint[], %(failed)s::bigint[],"
    " %(timeouts)s::bigint[], %(crashes)s::bigint[], %(seconds)s::float8[],"
    " %(stage_runs)s::bigint, %(messages)s::bigint, %(requeued)s::bigint, %(expired)s::bigint),"
    " pepsi.heartbeat(%(dispatcher_id)s::bigint, %(gauges)s::jsonb)"
)
SQL_FLUSH_STATS: Final = (
    "SELECT pepsi.flush_stats(%(stages)s::text[], %(processed)s::bigint[], %(failed)s::bigint[],"
    " %(timeouts)s::bigint[], %(crashes)s::bigint[], %(seconds)s::float8[],"
    " %(stage_runs)s::bigint, %(messages)s::bigint, %(requeued)s::bigint, %(expired)s::bigint)"
)
# Backends holding the dispatcher lock (an advisory lock on a bigint key is
# (classid, objid) = (high, low) 32 bits, objsubid 1) in this database: advisory
# locks are per database, and another database's dispatcher holds the same key.
SQL_LOCK_PIDS: Final = (
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND classid = %(classid)s::bigint::oid AND objid = %(objid)s::bigint::oid AND objsubid = 1"
)
SQL_TERMINATE: Final = "SELECT pg_terminate_backend(%(pid)s::int)"
# The overlay rows the dispatcher applies: apply_overlay uses only [stage-*] ones.
SQL_OVERLAY: Final = "SELECT section, option, value FROM pepsi.stage_config()"
SQL_DISPATCHERS: Final = (
    "SELECT dispatcher_id, hostname, pid, competing, started_at, heartbeat_age"
    " FROM pepsi.queue_dispatchers()"
)
# After a reconnect: which rows does the database think we hold? (Rows whose
# claim committed while its answer was lost with the connection are released.)
SQL_HELD: Final = "SELECT workqueue_id FROM pepsi.held_ids(%(dispatcher_id)s::bigint)"
SQL_STAGES_OF: Final = "SELECT workqueue_id, stage FROM pepsi.stages_of(%(ids)s::bigint[])"


def int_array(values: Iterable[int | None]) -> str:
    """A bigint[]/int[] parameter as its text literal ``{1,2,NULL}``: psycopg's list
    dumper costs ~1.7 µs of CPU per element (110 µs for 64 ids, measured), the
    join ~0.1 µs; every such parameter here is cast (``%(ids)s::bigint[]``)."""
    vals = list(values)
    if None in vals:
        return "{" + ",".join("NULL" if v is None else str(int(v)) for v in vals) + "}"
    return "{" + ",".join(map(str, map(int, vals))) + "}"


# -- the claim as sent ---------------------------------------------------------
# The claim commits without waiting for its WAL flush (synchronous_commit off
# for that transaction alone): a claim lost to a server crash leaves its rows
# pending, never half-claimed, and every later synchronous commit -- the
# worker's answer above all -- flushes it first. The dispatcher notices a
# server restart at reconnect and stops every worker before it claims again
# (coordinator/comeback.py); a competing replica also claims nothing after it
# connects until every other replica has done the same or is ORPHAN_TIMEOUT
# old (pepsi.replicas_away, ReplicasHold in coordinator/comeback.py).
#: The claim, each row also as a worker's line (workqueue_id, stage, priority,
#: line). The last parameter is the line limit of each stage (0: bare ids).
SQL_CLAIM_LINES: Final = (
    "SELECT c.* FROM set_config('synchronous_commit', 'off', true) AS async_commit,"
    " pepsi.claim_lines(%(dispatcher_id)s::bigint, %(stages)s::text[], %(caps)s::int[],"
    " %(skip_locked)s::boolean, %(after_ids)s::bigint[], %(line_limits)s::int[]) AS c"
)
#: The answer checks, then the claim, as ONE statement instead of a pipeline of
#: two (a busy stage's usual wake); they touch disjoint rows (running, pending).
#: Columns: workqueue_id, stage, priority, line, checked. The two calls share
#: the parameter dispatcher_id.
SQL_CHECK_AND_CLAIM: Final = (
    "SELECT a.workqueue_id, a.stage, NULL::integer AS priority, NULL::text AS line,"
    " true AS checked FROM pepsi.check_answered(%(dispatcher_id)s::bigint,"
    " %(answered)s::bigint[]) AS a"
    " UNION ALL SELECT c.workqueue_id, c.stage, c.priority, {line}, false FROM ({claim}) AS c"
)


class ClaimStatement:
    """The claim as sent (``pepsi.claim_lines``), without waiting for its WAL flush."""

    def __init__(self) -> None:
        #: the claim alone
        self.sql = SQL_CLAIM_LINES
        #: the answer checks and the claim in one statement
        self.with_checks = SQL_CHECK_AND_CLAIM.format(claim=self.sql, line="c.line")

    def args(self, dispatcher_id: int, params: ClaimParams) -> dict[str, Any]:
        """The claim's named parameters (``line_limits``: see :class:`ClaimParams`)."""
        after_ids, line_limits = params.after_ids, params.line_limits
        return {
            "dispatcher_id": dispatcher_id,
            "stages": list(params.stages),
            "caps": int_array(params.caps),
            # skip_locked: claim_lines always skips locked rows; sent as true for clarity.
            "skip_locked": True,
            "after_ids": None if after_ids is None else int_array(after_ids),
            "line_limits": None if line_limits is None else int_array(line_limits),
        }


def rerun_on_conflict(fn: Callable[[], T], what: str, attempts: int = 5) -> T:
    """Run ``fn``; re-run it after a transient 40001/40P01 error, with jittered backoff.

    Cheap insurance: with one writer per row these should not happen, but a
    DBA's statement or a competing replica can still deadlock with us.
    """
    backoff = Backoff(0.005)
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except TRANSIENT as exc:
            if attempt == attempts:
                raise
            log.warning("%s: transient %s, retrying (%d/%d)", what, exc.sqlstate, attempt, attempts)
            time.sleep(backoff.next() * (0.5 + random.random()))
    raise AssertionError("unreachable")


# -- what the statements return, decoded ----------------------------------------
def claimed_rows(cur: Any) -> ClaimedRows:
    """Claim rows (id, stage, priority[, line]) -> (id, stage) pairs, ids of
    priority not 0, and the lines by id (``pepsi.claim_lines``)."""
    rows = cur.fetchall()
    return ClaimedRows(
        [(r[0], r[1]) for r in rows],
        [r[0] for r in rows if len(r) > 2 and r[2]],
        {r[0]: r[3] for r in rows if len(r) > 3 and r[3] is not None},
    )


def requeue_row(row: Any) -> Requeue:
    """``pepsi.requeue_due``'s row (SQL_REQUEUE_DUE's columns) as a :class:`Requeue`."""
    if row is None:
        return Requeue(0, 0, 0, None)
    return Requeue(
        int(row[0] or 0),
        int(row[1] or 0),
        int(row[2] or 0),
        _seconds(row[3]),
        _pairs(row[4], row[5]),
        _pairs(row[6], row[7]),
    )


def _pairs(stages: Any, counts: Any) -> tuple[tuple[str, int], ...]:
    return tuple((s, int(n)) for s, n in zip(stages or (), counts or (), strict=True) if n)


def _seconds(value: Any) -> float | None:
    return None if value is None else value.total_seconds()


def _check_and_claim_result(rows: list[Any]) -> RoundTripResult:
    """SQL_CHECK_AND_CLAIM's rows: the checked ones left running, the claimed ones."""
    claimed = [r for r in rows if not r[4]]
    return RoundTripResult(
        left_running=[(r[0], r[1]) for r in rows if r[4]],
        requeue=None,
        claimed=[(r[0], r[1]) for r in claimed],
        off_floor=[r[0] for r in claimed if r[2]],
        lines={r[0]: r[3] for r in claimed if r[3] is not None},
    )


def _notification(channel: str, payload: str) -> str:
    """What the loop acts on for one notification: its channel, or DELAYED, or
    TRY_NOW + stage."""
    if channel == "workqueue" and payload == "delayed":
        return DELAYED
    if channel == "config_changed" and payload.startswith(TRY_NOW):
        return payload
    return channel


# -- params -> named parameters ---------------------------------------------------
def _errors_params(dispatcher_id: int, failures: Sequence[Failure]) -> dict[str, Any]:
    """``pepsi.record_dispatch_error``'s parameters for (id, status, reason) triples."""
    return {
        "dispatcher_id": dispatcher_id,
        "ids": [e[0] for e in failures],
        "statuses": [e[1] for e in failures],
        "reasons": [e[2] for e in failures],
    }


def _stages_params(dispatcher_id: int, stages: Iterable[StageConfig]) -> dict[str, Any]:
    """``pepsi.register_stages``' parameters: the stage table, one array per column."""
    cs = list(stages)

    def secs(v: float | None) -> timedelta | None:
        return None if v is None else timedelta(seconds=v)

    return {
        "dispatcher_id": dispatcher_id,
        "stages": [c.name for c in cs],
        "nexts": [" ".join(c.next) for c in cs],
        "max_retries": [c.max_retries for c in cs],
        "retry_delays": [secs(c.retry_delay) for c in cs],
        "retry_delays_max": [secs(c.retry_delay_max) for c in cs],
        "parallelisms": [c.parallelism for c in cs],
        "queue_limits": [c.queue_limit for c in cs],
    }


def _checks_params(dispatcher_id: int, ids: Sequence[int]) -> dict[str, Any]:
    return {"dispatcher_id": dispatcher_id, "ids": int_array(ids)}


def _lock_holders_text(rows: list[dict[str, Any]]) -> str:
    """The registry's rows as the "already served" message (see lock_holders)."""
    if not rows:
        return "a dispatcher that has not registered yet"
    rows.sort(key=lambda r: r.get("started_at") or datetime.min, reverse=True)
    competing = [r for r in rows if r.get("competing")]
    shown = competing or rows[:1]
    parts = []
    for r in shown:
        host = r.get("hostname") or "?"
        mode = "competing replica" if r.get("competing") else "dispatcher"
        text = f"{mode} {r.get('dispatcher_id', '?')} on {host} pid {r.get('pid', '?')}"
        started = r.get("started_at")
        if isinstance(started, datetime):
            text += f" since {started.isoformat(timespec='seconds')}"
        age = r.get("heartbeat_age")
        if isinstance(age, timedelta):
            text += f", last heartbeat {age.total_seconds():.0f} s ago"
        parts.append(text)
    return "; ".join(parts)


class PostgresStore:
    """The dispatcher's two connections and its ``pepsi.*`` calls: the
    :class:`~.port.DispatchStore` on PostgreSQL."""

    def __init__(self, dsn: str, competing: bool) -> None:
        self.dsn = dsn
        self.competing = competing
        self.listen: psycopg.Connection | None = None
        self.work: psycopg.Connection | None = None
        #: the claim's statements (pepsi.claim_lines)
        self.claiming = ClaimStatement()
        #: the server's start and crash-restart times, read at each connect of
        #: the work connection (None before the first).
        self.server_epoch: Epoch | None = None

    # -- connections -----------------------------------------------------------
    def connect(self) -> None:
        """Open both connections (closing any old ones first).

        The loop is single-threaded, so a statement that never returns would
        freeze it -- and with it every worker, once their stdout pipes fill.
        Hence TCP keepalives and tcp_user_timeout (a silently dead server is
        noticed in about a minute, not after the kernel's two hours), a
        connect_timeout of 10 s (DSN settings and PGCONNECT_TIMEOUT win) and, on
        the work connection, statement and lock timeouts: a claim stuck behind
        a DBA's lock fails after 10 s, the loop reconnects with backoff and
        keeps serving answers meanwhile.
        """
        self.close()
        self.listen = self._open("pepsi-dispatch")
        self.connect_work()

    def _open(self, application_name: str) -> psycopg.Connection:
        given = conninfo_to_dict(self.dsn)
        if os.environ.get("PGCONNECT_TIMEOUT"):
            given["connect_timeout"] = os.environ["PGCONNECT_TIMEOUT"]
        extra = {k: v for k, v in KEEPALIVES.items() if k not in given}
        return psycopg.connect(
            self.dsn, autocommit=True, application_name=application_name, **extra
        )

    def connect_work(self) -> None:
        """(Re)open only the work connection; the listen one (and its lock) stays."""
        self.close_work()
        self.work = self._open("pepsi-dispatch work")
        self.work.execute(SQL_SESSION_TIMEOUTS)
        row = self.work.execute(SQL_SERVER_EPOCH).fetchone()
        self.server_epoch = (row[0], row[1]) if row else None

    @staticmethod
    def _dead(conn: psycopg.Connection | None) -> bool:
        return conn is None or conn.closed or conn.broken

    def listen_dead(self) -> bool:
        """Is the listen connection (the one holding the lock) gone or broken?"""
        return self._dead(self.listen)

    def work_dead(self) -> bool:
        """Is the work connection gone or broken?"""
        return self._dead(self.work)

    def close_work(self) -> None:
        """Close the work connection only, ignoring errors."""
        if self.work is not None:
            try:
                self.work.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
        self.work = None

    def close(self) -> None:
        """Close both connections, ignoring errors (they may already be dead)."""
        self.close_work()
        if self.listen is not None:
            try:
                self.listen.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
        self.listen = None

    def dbname(self) -> str:
        """Name of the database connected to (for messages)."""
        conn = self.work or self.listen
        return conn.info.dbname if conn is not None else "?"

    def role(self) -> str:
        """The role the sessions log in as (for messages)."""
        conn = self.work or self.listen
        return conn.info.user if conn is not None else "?"

    def listen_fileno(self) -> int:
        """Socket of the listen connection, for the selector."""
        assert self.listen is not None
        return self.listen.pgconn.socket

    # -- the lock and LISTEN -----------------------------------------------------
    def try_lock(self) -> bool:
        """Take the advisory lock (shared in competing mode) on the listen connection."""
        assert self.listen is not None
        sql = SQL_TRY_LOCK_SHARED if self.competing else SQL_TRY_LOCK
        row = self.listen.execute(sql, {"key": LOCK_KEY}).fetchone()
        return bool(row and row[0])

    def listen_pid(self) -> int:
        """Server process id of the listen connection (the lock's holder)."""
        assert self.listen is not None
        return int(self.listen.info.backend_pid)

    def lock_pids(self) -> set[int]:
        """Server process ids of the sessions holding the dispatcher lock."""
        assert self.work is not None
        key = LOCK_KEY & 0xFFFFFFFFFFFFFFFF
        params = {"classid": key >> 32, "objid": key & 0xFFFFFFFF}
        rows = self.work.execute(SQL_LOCK_PIDS, params).fetchall()
        return {int(r[0]) for r in rows}

    def terminate_backend(self, pid: int) -> bool:
        """``pg_terminate_backend(pid)`` (our own old session: same role)."""
        assert self.work is not None
        row = self.work.execute(SQL_TERMINATE, {"pid": pid}).fetchone()
        return bool(row and row[0])

    def lock_holders(self) -> str:
        """Who holds the database, for the "already served" message (best effort).

        The registry can still list a dispatcher that was killed (its row
        goes only after ORPHAN_TIMEOUT), so: competing replicas if any are
        registered, else only the newest registration -- a single dispatcher
        registers after taking the lock, so the newest one is the holder.
        """
        try:
            assert self.work is not None
            with self.work.cursor(row_factory=dict_row) as cur:
                rows = cur.execute(SQL_DISPATCHERS).fetchall()
        except psycopg.Error:
            return "an unregistered dispatcher"
        return _lock_holders_text(rows)

    def start_listening(self) -> None:
        """LISTEN on both channels (on the listen connection)."""
        assert self.listen is not None
        for channel in CHANNELS:
            self.listen.execute(f"LISTEN {channel}")

    def notifications(self) -> list[str]:
        """Drain pending notifications without blocking; returns their channels
        (:data:`DELAYED` for a delayed message's, :data:`TRY_NOW` and the stage
        for a resumed stage's)."""
        assert self.listen is not None
        return [_notification(n.channel, n.payload) for n in self.listen.notifies(timeout=0)]

    def ping_listen(self) -> None:
        """A trivial statement on the listen connection, so a dead link shows up."""
        assert self.listen is not None
        self.listen.execute("SELECT 1")

    # -- single calls (each its own implicit transaction) ---------------------
    def _scalar(self, sql: str, params: dict[str, Any], what: str) -> Any:
        work = self.work
        assert work is not None

        def run() -> Any:
            row = work.execute(sql, params).fetchone()
            return row[0] if row else None

        return rerun_on_conflict(run, what)

    def _rows(self, sql: str, params: dict[str, Any], what: str) -> list[Any]:
        """All rows of ``sql``, re-run on a transient conflict."""
        work = self.work
        assert work is not None
        return rerun_on_conflict(lambda: work.execute(sql, params).fetchall(), what)

    def register(self) -> int:
        """``pepsi.register_dispatcher`` → dispatcher id."""
        params = {"hostname": socket.gethostname(), "pid": os.getpid(), "competing": self.competing}
        return int(self._scalar(SQL_REGISTER, params, "register"))

    def heartbeat(self, dispatcher_id: int, gauges: dict[str, Any] | None = None) -> None:
        """``pepsi.heartbeat``; ``gauges`` (v3) land in ``dispatchers.gauges``."""
        if gauges is None:
            self._scalar(SQL_HEARTBEAT, {"dispatcher_id": dispatcher_id}, "heartbeat")
        else:
            params = {"dispatcher_id": dispatcher_id, "gauges": Jsonb(gauges)}
            self._scalar(SQL_HEARTBEAT_GAUGES, params, "heartbeat")

    def schema_version(self) -> str | None:
        """``pepsi.schema_version()``: the alembic revision(s) of the database."""
        return self._scalar("SELECT pepsi.schema_version()", {}, "schema_version")

    def registered(self, dispatcher_id: int) -> bool:
        """Is our registration still there (competing: not declared dead by a replica)?"""
        params = {"dispatcher_id": dispatcher_id}
        return bool(self._scalar(SQL_REGISTERED, params, "registered"))

    def register_stages(self, dispatcher_id: int, stages: Iterable[StageConfig]) -> None:
        """``pepsi.register_stages``: the stage table (``StageConfig``s) into pepsi.stages."""
        self._scalar(SQL_REGISTER_STAGES, _stages_params(dispatcher_id, stages), "register_stages")

    def unregister(self, dispatcher_id: int) -> None:
        """``pepsi.unregister_dispatcher``."""
        self._scalar(SQL_UNREGISTER, {"dispatcher_id": dispatcher_id}, "unregister")

    def reset_orphans(self, dispatcher_id: int, orphan_timeout: float) -> int:
        """``pepsi.reset_orphans`` → rows put back to pending."""
        params = {
            "dispatcher_id": dispatcher_id,
            "competing": self.competing,
            "orphan_timeout": orphan_timeout,
        }
        return int(self._scalar(SQL_RESET_ORPHANS, params, "reset_orphans") or 0)

    def replicas_away(
        self, dispatcher_id: int, orphan_timeout: float
    ) -> list[tuple[int, str, int]]:
        """``pepsi.replicas_away``: (id, hostname, pid) of the replicas that last
        heartbeated before the server restarted, have no session, and are younger
        than ``orphan_timeout`` (claims wait for them)."""
        params = {"dispatcher_id": dispatcher_id, "orphan_timeout": orphan_timeout}
        rows = self._rows(SQL_REPLICAS_AWAY, params, "replicas_away")
        return [(int(r[0]), str(r[1]), int(r[2])) for r in rows]

    def release(self, dispatcher_id: int, ids: Sequence[int] | None) -> int:
        """``pepsi.release``: held rows (all when ``ids`` is None) back to pending."""
        params = {"dispatcher_id": dispatcher_id, "ids": None if ids is None else int_array(ids)}
        return int(self._scalar(SQL_RELEASE, params, "release") or 0)

    def requeue_due(self, params: RequeueParams) -> Requeue:
        """``pepsi.requeue_due``: each stage's MAX_RETRIES comes from the stage
        registry; ``expiry`` is EXPIRY in seconds (None: nothing expires)."""
        work = self.work
        assert work is not None
        values = params._asdict()

        def run() -> Requeue:
            return requeue_row(work.execute(SQL_REQUEUE_DUE, values).fetchone())

        return rerun_on_conflict(run, "requeue_due")

    def purge_done(self, retention: float, batch: int) -> int:
        """``pepsi.purge_done``: one batch of old done rows deleted."""
        params = {"retention": retention, "batch": batch}
        return int(self._scalar(SQL_PURGE, params, "purge_done") or 0)

    def register_schedules(self, params: RegisterSchedulesParams) -> dict[str, datetime | None]:
        """``pepsi.register_schedules``: each schedule's settled-through time, by name."""
        return dict(self._rows(SQL_REGISTER_SCHEDULES, params._asdict(), "register_schedules"))

    def fire_schedule(self, params: FireScheduleParams) -> list[FiredTick]:
        """``pepsi.fire_schedule``: (tick, message id, inserted) per tick handled.
        Raises psycopg.errors.LockNotAvailable when a lock held it past 200 ms."""
        values = {**params._asdict(), "payload": Jsonb(params.payload)}
        return self._rows(SQL_FIRE_SCHEDULE, values, "fire_schedule")

    def keep_dead_letters(self, batch: int) -> int:
        """``pepsi.keep_dead_letters``: one batch of kept failed rows moved out of
        the hot table (into ``pepsi.dead_letters``)."""
        return int(self._scalar(SQL_KEEP_DEAD_LETTERS, {"batch": batch}, "keep_dead_letters") or 0)

    def flush_stats(
        self, deltas: dict[str, Any], gauges: tuple[int, dict[str, Any]] | None = None
    ) -> None:
        """``pepsi.flush_stats`` with all deltas, one call; with ``gauges``
        (dispatcher id, gauges) also ``pepsi.heartbeat`` in the same statement."""
        if gauges is None:
            self._scalar(SQL_FLUSH_STATS, deltas, "flush_stats")
            return
        did, values = gauges
        both = {**deltas, "dispatcher_id": did, "gauges": Jsonb(values)}
        self._scalar(SQL_FLUSH_STATS_AND_GAUGES, both, "flush_stats")

    def overlay(self) -> list[tuple[str, str, str]]:
        """The ``[stage-*]`` rows of ``pepsi.config`` (the configuration overlay),
        through ``pepsi.stage_config``."""
        assert self.work is not None
        rows = self.work.execute(SQL_OVERLAY).fetchall()
        return [(str(s), str(o), str(v)) for s, o, v in rows]

    def held(self, dispatcher_id: int) -> set[int]:
        """Ids of the running rows the database says this dispatcher holds."""
        assert self.work is not None
        rows = self.work.execute(SQL_HELD, {"dispatcher_id": dispatcher_id}).fetchall()
        return {r[0] for r in rows}

    def stages_of(self, ids: Iterable[int]) -> dict[int, str]:
        """Current stage of each of ``ids`` (missing rows left out)."""
        assert self.work is not None
        rows = self.work.execute(SQL_STAGES_OF, {"ids": list(ids)}).fetchall()
        return {int(r[0]): str(r[1]) for r in rows}

    # -- the parts of a round trip, one statement each (database/isolation.py) --
    def record_errors(self, dispatcher_id: int, failures: Sequence[Failure]) -> int:
        """``pepsi.record_dispatch_error`` for (id, status, reason) triples, alone."""
        params = _errors_params(dispatcher_id, failures)
        return int(self._scalar(SQL_RECORD_ERRORS, params, "record_dispatch_error") or 0)

    def check_answered(self, dispatcher_id: int, ids: Sequence[int]) -> list[tuple[int, str]]:
        """``pepsi.check_answered`` alone: the rows failed for being left running."""
        rows = self._rows(SQL_CHECK_ANSWERED, _checks_params(dispatcher_id, ids), "check_answered")
        return [(r[0], r[1]) for r in rows]

    def claim(self, dispatcher_id: int, params: ClaimParams) -> ClaimedRows:
        """The claim alone: (id, stage) of the claimed rows; ids of priority != 0;
        the rows returned as workers' lines, by id (``params.line_limits``: each
        stage's longest line in bytes, aligned with the stages; None or 0: bare ids)."""
        work = self.work
        assert work is not None
        claiming = self.claiming
        values = claiming.args(dispatcher_id, params)
        return rerun_on_conflict(lambda: claimed_rows(work.execute(claiming.sql, values)), "claim")

    def _check_and_claim(
        self, dispatcher_id: int, answered: Sequence[int], claim: ClaimParams
    ) -> RoundTripResult:
        """The answer checks and the claim in one statement (no pipeline)."""
        work = self.work
        assert work is not None
        claiming = self.claiming
        values = {**claiming.args(dispatcher_id, claim), "answered": int_array(answered)}

        def run() -> RoundTripResult:
            return _check_and_claim_result(work.execute(claiming.with_checks, values).fetchall())

        return rerun_on_conflict(run, "round trip")

    # -- the hot path ------------------------------------------------------------
    def round_trip(self, dispatcher_id: int, params: RoundTripParams) -> RoundTripResult:
        """One wake's writes and claim, pipelined: all or nothing.

        ``params.failures`` -- (id, status, reason) for ``pepsi.record_dispatch_error``;
        ``answered`` -- ids answered ``0``, for ``pepsi.check_answered``;
        ``requeue`` -- ``pepsi.requeue_due``'s params or None; ``claim`` -- the
        claim's (see :meth:`claim`) or None. Order matters: failures and checks
        first, so the claim never sees a row still settling.
        """
        failures, answered, requeue, claim = params
        if claim is not None and not failures and requeue is None:
            # The claim alone (an idle dispatcher woken by an enqueue), or with the
            # answer checks: one plain statement instead of a pipeline's Bind, Sync
            # and Flush sent apart (0.37 ms less per wake: docs/BENCHMARKS.md).
            if answered:
                return self._check_and_claim(dispatcher_id, answered, claim)
            claimed, off_floor, lines = self.claim(dispatcher_id, claim)
            return RoundTripResult([], None, claimed, off_floor, lines=lines)
        return rerun_on_conflict(lambda: self._pipeline(dispatcher_id, params), "round trip")

    def _pipeline(self, dispatcher_id: int, params: RoundTripParams) -> RoundTripResult:
        """:meth:`round_trip`'s statements in one pipeline (one implicit transaction)."""
        work = self.work
        assert work is not None
        failures, answered, requeue, claim = params
        c_err = c_chk = c_req = c_claim = None
        with work.pipeline():
            if failures:
                c_err = work.execute(SQL_RECORD_ERRORS, _errors_params(dispatcher_id, failures))
            if answered:
                c_chk = work.execute(SQL_CHECK_ANSWERED, _checks_params(dispatcher_id, answered))
            if requeue is not None:
                c_req = work.execute(SQL_REQUEUE_DUE, requeue._asdict())
            if claim is not None:
                c_claim = work.execute(self.claiming.sql, self.claiming.args(dispatcher_id, claim))
        retried: list[tuple[int, str, str, str]] = []
        claimed, off_floor, lines = claimed_rows(c_claim) if c_claim else ([], [], {})
        if c_err is not None:
            paused = {r[0]: r[1] for r in c_err.fetchall() if r[2] == "paused"}
            retried = [(e[0], paused[e[0]], e[1], e[2]) for e in failures if e[0] in paused]
        return RoundTripResult(
            left_running=[(r[0], r[1]) for r in c_chk.fetchall()] if c_chk else [],
            requeue=requeue_row(c_req.fetchone()) if c_req else None,
            claimed=claimed,
            retried=retried,
            off_floor=off_floor,
            lines=lines,
        )


__all__ = [
    "LOCK_KEY",
    "ClaimStatement",
    "PostgresStore",
    "int_array",
    "rerun_on_conflict",
]
