"""Database access for the dispatcher: two connections and thin wrappers.

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
holds only the constant call strings. The hot path, :meth:`Database.round_trip`,
sends up to four calls in one pipeline: measured on the 2-core CI box against
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
from pepsi_dispatch.coordinator.database.results import (
    Requeue,
    RoundTripResult,
    claimed_rows,
    requeue_row,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Arguments of ``pepsi.requeue_due``: EXPIRY in seconds (None: never). The
#: retry policy is the stage registry's (pepsi.stages), not an argument.
RequeueArgs = tuple[float | None]

#: Key of the advisory lock that marks "a dispatcher serves this database".
#: Exclusive for a single dispatcher, shared for competing replicas, so the two
#: modes exclude each other. ASCII "pepsidsp" as a signed 64-bit integer.
LOCK_KEY: Final = int.from_bytes(b"pepsidsp", "big", signed=True)

CHANNELS: Final = ("workqueue", "config_changed")
#: What :meth:`Database.notifications` returns for NOTIFY workqueue, 'delayed'
#: (pepsi.enqueue of a delayed message: run requeue_due to learn its due time).
DELAYED: Final = "workqueue:delayed"
#: What :meth:`Database.notifications` returns, followed by the stage's name, for
#: NOTIFY config_changed, 'try_now:STAGE' (pepsi.pause_stage resuming a stage:
#: end its hold-off now). Not a reload: the overlay may not have changed.
TRY_NOW: Final = "try_now:"


def _notification(channel: str, payload: str) -> str:
    """What the loop acts on for one notification: its channel, or DELAYED, or
    TRY_NOW + stage."""
    if channel == "workqueue" and payload == "delayed":
        return DELAYED
    if channel == "config_changed" and payload.startswith(TRY_NOW):
        return payload
    return channel


#: Transient errors the retry helper re-runs (40001, 40P01).
TRANSIENT: Final = (pgerrors.SerializationFailure, pgerrors.DeadlockDetected)
#: Errors that mean "the connection is gone"; the loop reconnects.
CONNECTION_LOST: Final = (psycopg.OperationalError, psycopg.InterfaceError)

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
SQL_TRY_LOCK: Final = "SELECT pg_try_advisory_lock(%s::bigint)"
SQL_TRY_LOCK_SHARED: Final = "SELECT pg_try_advisory_lock_shared(%s::bigint)"
SQL_REGISTER: Final = "SELECT pepsi.register_dispatcher(%s::text, %s::int, %s::boolean)"
SQL_HEARTBEAT: Final = "SELECT pepsi.heartbeat(%s::bigint)"
SQL_HEARTBEAT_GAUGES: Final = "SELECT pepsi.heartbeat(%s::bigint, %s::jsonb)"
SQL_REGISTERED: Final = "SELECT pepsi.dispatcher_registered(%s::bigint)"
SQL_UNREGISTER: Final = "SELECT pepsi.unregister_dispatcher(%s::bigint)"
SQL_RESET_ORPHANS: Final = (
    "SELECT pepsi.reset_orphans(%s::bigint, %s::boolean, make_interval(secs => %s::float8))"
)
SQL_RELEASE: Final = "SELECT pepsi.release(%s::bigint, %s::bigint[])"
# record_dispatch_error v3 returns the rows it changed with their new status:
# 'paused' is an automatic retry (the stage's RETRY_DELAY), not a failure.
SQL_RECORD_ERRORS: Final = (
    "SELECT workqueue_id, stage, status FROM pepsi.record_dispatch_error(%s::bigint, %s::bigint[],"
    " %s::text[], %s::text[])"
)
SQL_REGISTER_STAGES: Final = (
    "SELECT pepsi.register_stages(%s::bigint, %s::text[], %s::text[], %s::int[],"
    " %s::interval[], %s::interval[], %s::int[], %s::int[])"
)
SQL_CHECK_ANSWERED: Final = (
    "SELECT workqueue_id, stage FROM pepsi.check_answered(%s::bigint, %s::bigint[])"
)
# statement_timestamp() comes along so the next-due timer is computed on the
# database's clock, immune to skew between this host and the server. A row
# paused until 'infinity' is never due: no timer (subtracting it would raise
# "cannot subtract infinite timestamps" and fail the whole round trip).
SQL_REQUEUE_DUE: Final = (
    "SELECT requeued, exhausted, expired,"
    " CASE WHEN isfinite(next_due) THEN next_due - statement_timestamp() END,"
    " exhausted_stages, exhausted_counts, expired_stages, expired_counts"
    " FROM pepsi.requeue_due(NULL, NULL, NULL, make_interval(secs => %s::float8))"
)
SQL_PURGE: Final = "SELECT pepsi.purge_done(make_interval(secs => %s::float8), %s::int)"
SQL_KEEP_DEAD_LETTERS: Final = "SELECT pepsi.keep_dead_letters(%s::int)"
SQL_REGISTER_SCHEDULES: Final = (
    "SELECT name, settled_through FROM pepsi.register_schedules("
    "%s::text[], %s::text[], %s::text[], %s::timestamptz[])"
)
SQL_FIRE_SCHEDULE: Final = (
    "SELECT tick, workqueue_id, inserted FROM pepsi.fire_schedule("
    "%s, %s::timestamptz[], %s, %s, %s::int, %s::text, %s::timestamptz)"
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
    " AND classid = %s::bigint::oid AND objid = %s::bigint::oid AND objsubid = 1"
)
SQL_TERMINATE: Final = "SELECT pg_terminate_backend(%s::int)"
# The overlay rows the dispatcher applies: apply_overlay uses only [stage-*] ones.
SQL_OVERLAY: Final = "SELECT section, option, value FROM pepsi.stage_config()"
SQL_DISPATCHERS: Final = (
    "SELECT dispatcher_id, hostname, pid, competing, started_at, heartbeat_age"
    " FROM pepsi.queue_dispatchers()"
)
# After a reconnect: which rows does the database think we hold? (Rows whose
# claim committed while its answer was lost with the connection are released.)
SQL_HELD: Final = "SELECT workqueue_id FROM pepsi.held_ids(%s::bigint)"
SQL_STAGES_OF: Final = "SELECT workqueue_id, stage FROM pepsi.stages_of(%s::bigint[])"


def int_array(values: Iterable[int | None]) -> str:
    """A bigint[]/int[] parameter as its text literal ``{1,2,NULL}``: psycopg's list
    dumper costs ~1.7 µs of CPU per element (110 µs for 64 ids, measured), the
    join ~0.1 µs; every such parameter here is cast (``%s::bigint[]``)."""
    vals = list(values)
    if None in vals:
        return "{" + ",".join("NULL" if v is None else str(int(v)) for v in vals) + "}"
    return "{" + ",".join(map(str, map(int, vals))) + "}"


# -- the claim as sent ---------------------------------------------------------
#: Arguments of ``pepsi.claim``: stages, their capacities, the claim floors
#: (aligned with the stages; None: unbounded).
ClaimArgs = tuple[list[str], list[int], list[int | None] | None]

# A single dispatcher's claim commits without waiting for its WAL flush
# (synchronous_commit off for that transaction alone): a claim lost to a server
# crash leaves its rows pending, never half-claimed, and every later synchronous
# commit -- the worker's answer above all -- flushes it first. The dispatcher
# notices a server restart at reconnect and stops every worker
# (coordinator/comeback.py). Competing replicas claim synchronously: another
# replica could take a lost claim's rows before we reconnect and stop ours.
#: The claim, each row also as a worker's line (workqueue_id, stage, priority,
#: line). The last argument is the line limit of each stage (0: bare ids).
SQL_CLAIM_LINES: Final = (
    "SELECT * FROM pepsi.claim_lines(%s::bigint, %s::text[], %s::int[], %s::boolean,"
    " %s::bigint[], %s::int[])"
)
SQL_CLAIM_LINES_NO_FLUSH_WAIT: Final = (
    "SELECT c.* FROM set_config('synchronous_commit', 'off', true) AS async_commit,"
    " pepsi.claim_lines(%s::bigint, %s::text[], %s::int[], %s::boolean, %s::bigint[],"
    " %s::int[]) AS c"
)
#: The answer checks, then the claim, as ONE statement instead of a pipeline of
#: two (a busy stage's usual wake); they touch disjoint rows (running, pending).
#: Columns: workqueue_id, stage, priority, line, checked.
SQL_CHECK_AND_CLAIM: Final = (
    "SELECT a.workqueue_id, a.stage, NULL::integer AS priority, NULL::text AS line,"
    " true AS checked FROM pepsi.check_answered(%s::bigint, %s::bigint[]) AS a"
    " UNION ALL SELECT c.workqueue_id, c.stage, c.priority, {line}, false FROM ({claim}) AS c"
)


class ClaimStatement:
    """The claim as sent (``pepsi.claim_lines``): without waiting for the WAL
    flush unless ``competing``."""

    def __init__(self, competing: bool) -> None:
        self.competing = competing
        #: the claim alone
        self.sql = SQL_CLAIM_LINES if competing else SQL_CLAIM_LINES_NO_FLUSH_WAIT
        #: the answer checks and the claim in one statement
        self.with_checks = SQL_CHECK_AND_CLAIM.format(claim=self.sql, line="c.line")

    def args(
        self,
        dispatcher_id: int,
        stages: Sequence[str],
        caps: Sequence[int],
        after_ids: Sequence[int | None] | None,
        line_limits: Sequence[int] | None = None,
    ) -> tuple[Any, ...]:
        """The claim's parameters (``line_limits``: see ``Database.claim``)."""
        bounds = None if after_ids is None else int_array(after_ids)
        # skip_locked: claim_lines always skips locked rows; sent as true for clarity.
        limits = None if line_limits is None else int_array(line_limits)
        return (dispatcher_id, list(stages), int_array(caps), True, bounds, limits)


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


def _errors_args(
    dispatcher_id: int, failures: Sequence[tuple[int, str, str]]
) -> tuple[int, list[int], list[str], list[str]]:
    """``pepsi.record_dispatch_error``'s arguments for (id, status, reason) triples."""
    return (
        dispatcher_id,
        [e[0] for e in failures],
        [e[1] for e in failures],
        [e[2] for e in failures],
    )


class Database:
    """The dispatcher's two connections and its ``pepsi.*`` calls."""

    def __init__(self, dsn: str, competing: bool) -> None:
        self.dsn = dsn
        self.competing = competing
        self.listen: psycopg.Connection | None = None
        self.work: psycopg.Connection | None = None
        #: the claim's statements (pepsi.claim_lines)
        self.claiming = ClaimStatement(competing)
        #: the server's start and crash-restart times, read at each connect of
        #: the work connection (None before the first).
        self.server_epoch: tuple[str, str] | None = None

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

    def listen_fileno(self) -> int:
        """Socket of the listen connection, for the selector."""
        assert self.listen is not None
        return self.listen.pgconn.socket

    def try_lock(self) -> bool:
        """Take the advisory lock (shared in competing mode) on the listen connection."""
        assert self.listen is not None
        sql = SQL_TRY_LOCK_SHARED if self.competing else SQL_TRY_LOCK
        row = self.listen.execute(sql, (LOCK_KEY,)).fetchone()
        return bool(row and row[0])

    def listen_pid(self) -> int:
        """Server process id of the listen connection (the lock's holder)."""
        assert self.listen is not None
        return int(self.listen.info.backend_pid)

    def lock_pids(self) -> set[int]:
        """Server process ids of the sessions holding the dispatcher lock."""
        assert self.work is not None
        key = LOCK_KEY & 0xFFFFFFFFFFFFFFFF
        rows = self.work.execute(SQL_LOCK_PIDS, (key >> 32, key & 0xFFFFFFFF)).fetchall()
        return {int(r[0]) for r in rows}

    def terminate_backend(self, pid: int) -> bool:
        """``pg_terminate_backend(pid)`` (our own old session: same role)."""
        assert self.work is not None
        row = self.work.execute(SQL_TERMINATE, (pid,)).fetchone()
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
    def _scalar(self, sql: str, params: Sequence[Any] | dict[str, Any], what: str) -> Any:
        work = self.work
        assert work is not None

        def run() -> Any:
            row = work.execute(sql, params).fetchone()
            return row[0] if row else None

        return rerun_on_conflict(run, what)

    def register(self) -> int:
        """``pepsi.register_dispatcher`` → dispatcher id."""
        return int(
            self._scalar(
                SQL_REGISTER, (socket.gethostname(), os.getpid(), self.competing), "register"
            )
        )

    def heartbeat(self, dispatcher_id: int, gauges: dict[str, Any] | None = None) -> None:
        """``pepsi.heartbeat``; ``gauges`` (v3) land in ``dispatchers.gauges``."""
        if gauges is None:
            self._scalar(SQL_HEARTBEAT, (dispatcher_id,), "heartbeat")
        else:
            self._scalar(SQL_HEARTBEAT_GAUGES, (dispatcher_id, Jsonb(gauges)), "heartbeat")

    def schema_version(self) -> str | None:
        """``pepsi.schema_version()``: the alembic revision(s) of the database."""
        return self._scalar("SELECT pepsi.schema_version()", (), "schema_version")

    def registered(self, dispatcher_id: int) -> bool:
        """Is our registration still there (competing: not declared dead by a replica)?"""
        return bool(self._scalar(SQL_REGISTERED, (dispatcher_id,), "registered"))

    def register_stages(self, dispatcher_id: int, stages: Iterable[Any]) -> None:
        """``pepsi.register_stages``: the stage table (``StageConfig``s) into pepsi.stages."""
        cs = list(stages)

        def secs(v: float | None) -> timedelta | None:
            return None if v is None else timedelta(seconds=v)

        self._scalar(
            SQL_REGISTER_STAGES,
            (
                dispatcher_id,
                [c.name for c in cs],
                [" ".join(c.next) for c in cs],
                [c.max_retries for c in cs],
                [secs(c.retry_delay) for c in cs],
                [secs(c.retry_delay_max) for c in cs],
                [c.parallelism for c in cs],
                [c.queue_limit for c in cs],
            ),
            "register_stages",
        )

    def unregister(self, dispatcher_id: int) -> None:
        """``pepsi.unregister_dispatcher``."""
        self._scalar(SQL_UNREGISTER, (dispatcher_id,), "unregister")

    def reset_orphans(self, dispatcher_id: int, orphan_timeout: float) -> int:
        """``pepsi.reset_orphans`` → rows put back to pending."""
        n = self._scalar(
            SQL_RESET_ORPHANS, (dispatcher_id, self.competing, orphan_timeout), "reset_orphans"
        )
        return int(n or 0)

    def release(self, dispatcher_id: int, ids: Sequence[int] | None) -> int:
        """``pepsi.release``: held rows (all when ``ids`` is None) back to pending."""
        n = self._scalar(
            SQL_RELEASE, (dispatcher_id, None if ids is None else int_array(ids)), "release"
        )
        return int(n or 0)

    def requeue_due(self, expiry: float | None) -> Requeue:
        """``pepsi.requeue_due``: each stage's MAX_RETRIES comes from the stage
        registry; ``expiry`` is EXPIRY in seconds (None: nothing expires)."""
        work = self.work
        assert work is not None

        def run() -> Requeue:
            return requeue_row(work.execute(SQL_REQUEUE_DUE, (expiry,)).fetchone())

        return rerun_on_conflict(run, "requeue_due")

    def purge_done(self, retention: float, batch: int) -> int:
        """``pepsi.purge_done``: one batch of old done rows deleted."""
        return int(self._scalar(SQL_PURGE, (retention, batch), "purge_done") or 0)

    def register_schedules(
        self, names: list[str], stages: list[str], specs: list[str], nexts: list[datetime]
    ) -> dict[str, datetime | None]:
        """``pepsi.register_schedules``: each schedule's settled-through time, by name."""
        work = self.work
        assert work is not None
        args = (names, stages, specs, nexts)

        def run() -> list[tuple[str, datetime | None]]:
            return work.execute(SQL_REGISTER_SCHEDULES, args).fetchall()

        return dict(rerun_on_conflict(run, "register_schedules"))

    def fire_schedule(
        self,
        name: str,
        ticks: list[datetime],
        stage: str,
        payload: dict[str, Any],
        priority: int,
        dedupe_key: str | None,
        next_tick: datetime,
    ) -> list[tuple[datetime, int, bool]]:
        """``pepsi.fire_schedule``: (tick, message id, inserted) per tick handled.
        Raises psycopg.errors.LockNotAvailable when a lock held it past 200 ms."""
        work = self.work
        assert work is not None
        args = (name, ticks, stage, Jsonb(payload), priority, dedupe_key, next_tick)

        def run() -> list[tuple[datetime, int, bool]]:
            return work.execute(SQL_FIRE_SCHEDULE, args).fetchall()

        return rerun_on_conflict(run, "fire_schedule")

    def keep_dead_letters(self, batch: int) -> int:
        """``pepsi.keep_dead_letters``: one batch of kept failed rows moved out of
        the hot table (into ``pepsi.dead_letters``)."""
        return int(self._scalar(SQL_KEEP_DEAD_LETTERS, (batch,), "keep_dead_letters") or 0)

    def flush_stats(
        self, args: dict[str, Any], gauges: tuple[int, dict[str, Any]] | None = None
    ) -> None:
        """``pepsi.flush_stats`` with all deltas, one call; with ``gauges``
        (dispatcher id, gauges) also ``pepsi.heartbeat`` in the same statement."""
        if gauges is None:
            self._scalar(SQL_FLUSH_STATS, args, "flush_stats")
            return
        did, values = gauges
        both = {**args, "dispatcher_id": did, "gauges": Jsonb(values)}
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
        return {r[0] for r in self.work.execute(SQL_HELD, (dispatcher_id,)).fetchall()}

    def stages_of(self, ids: Iterable[int]) -> dict[int, str]:
        """Current stage of each of ``ids`` (missing rows left out)."""
        assert self.work is not None
        rows = self.work.execute(SQL_STAGES_OF, (list(ids),)).fetchall()
        return {int(r[0]): str(r[1]) for r in rows}

    # -- the parts of a round trip, one statement each (database/isolation.py) --
    def record_errors(self, dispatcher_id: int, failures: Sequence[tuple[int, str, str]]) -> int:
        """``pepsi.record_dispatch_error`` for (id, status, reason) triples, alone."""
        n = self._scalar(
            SQL_RECORD_ERRORS, _errors_args(dispatcher_id, failures), "record_dispatch_error"
        )
        return int(n or 0)

    def check_answered(self, dispatcher_id: int, ids: Sequence[int]) -> list[tuple[int, str]]:
        """``pepsi.check_answered`` alone: the rows failed for being left running."""
        work = self.work
        assert work is not None

        def run() -> list[tuple[int, str]]:
            rows = work.execute(SQL_CHECK_ANSWERED, (dispatcher_id, int_array(ids))).fetchall()
            return [(r[0], r[1]) for r in rows]

        return rerun_on_conflict(run, "check_answered")

    def claim(
        self,
        dispatcher_id: int,
        stages: Sequence[str],
        caps: Sequence[int],
        after_ids: Sequence[int | None] | None,
        line_limits: Sequence[int] | None = None,
    ) -> tuple[list[tuple[int, str]], list[int], dict[int, str]]:
        """The claim alone: (id, stage) of the claimed rows; ids of priority != 0;
        the rows returned as workers' lines, by id (``line_limits``: each stage's
        longest line in bytes, aligned with ``stages``; None or 0: bare ids)."""
        work = self.work
        assert work is not None
        claiming = self.claiming
        args = claiming.args(dispatcher_id, stages, caps, after_ids, line_limits)
        return rerun_on_conflict(lambda: claimed_rows(work.execute(claiming.sql, args)), "claim")

    def _check_and_claim(
        self,
        dispatcher_id: int,
        answered: Sequence[int],
        claim: ClaimArgs,
        line_limits: Sequence[int] | None,
    ) -> RoundTripResult:
        """The answer checks and the claim in one statement (no pipeline)."""
        work = self.work
        assert work is not None
        claiming = self.claiming
        claim_args = claiming.args(dispatcher_id, *claim, line_limits)
        args = (dispatcher_id, int_array(answered), *claim_args)

        def run() -> RoundTripResult:
            rows = work.execute(claiming.with_checks, args).fetchall()
            claimed = [r for r in rows if not r[4]]
            return RoundTripResult(
                left_running=[(r[0], r[1]) for r in rows if r[4]],
                requeue=None,
                claimed=[(r[0], r[1]) for r in claimed],
                off_floor=[r[0] for r in claimed if r[2]],
                lines={r[0]: r[3] for r in claimed if r[3] is not None},
            )

        return rerun_on_conflict(run, "round trip")

    # -- the hot path ------------------------------------------------------------
    def round_trip(
        self,
        dispatcher_id: int,
        failures: Sequence[tuple[int, str, str]],
        answered: Sequence[int],
        requeue: RequeueArgs | None,
        claim: ClaimArgs | None,
        line_limits: Sequence[int] | None = None,
    ) -> RoundTripResult:
        """One wake's writes and claim, pipelined: all or nothing.

        ``failures`` -- (id, status, reason) for ``pepsi.record_dispatch_error``;
        ``answered`` -- ids answered ``0``, for ``pepsi.check_answered``;
        ``requeue`` -- arguments of ``pepsi.requeue_due`` or None;
        ``claim`` -- (stages, caps, after_ids: the claim floors, aligned with
        stages, None for no bound) for ``pepsi.claim`` or None; ``line_limits`` --
        each claimed stage's longest worker line (see :meth:`claim`). Order matters:
        failures and checks first, so the claim never sees a row still settling.
        """
        work = self.work
        assert work is not None
        if claim is not None and not failures and requeue is None:
            # The claim alone (an idle dispatcher woken by an enqueue), or with the
            # answer checks: one plain statement instead of a pipeline's Bind, Sync
            # and Flush sent apart (0.37 ms less per wake: docs/BENCHMARKS.md).
            if answered:
                return self._check_and_claim(dispatcher_id, answered, claim, line_limits)
            claimed, off_floor, lines = self.claim(dispatcher_id, *claim, line_limits)
            return RoundTripResult([], None, claimed, off_floor, lines=lines)

        def run() -> RoundTripResult:
            c_err = c_chk = c_req = c_claim = None
            with work.pipeline():
                if failures:
                    c_err = work.execute(SQL_RECORD_ERRORS, _errors_args(dispatcher_id, failures))
                if answered:
                    c_chk = work.execute(SQL_CHECK_ANSWERED, (dispatcher_id, int_array(answered)))
                if requeue is not None:
                    c_req = work.execute(SQL_REQUEUE_DUE, requeue)
                if claim is not None:
                    c_claim = work.execute(
                        self.claiming.sql, self.claiming.args(dispatcher_id, *claim, line_limits)
                    )
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

        return rerun_on_conflict(run, "round trip")
