"""pepsi-httpd's state: one database connection, the 1 s snapshot cache, the chart ring.

Thread-safe: ThreadingHTTPServer serves each request in a thread; the
connection is used under a lock (a scrape is one call, so requests wait at
most one snapshot query for each other).

Everything comes from the database: the stage graph from the stage registry
the dispatcher writes (``pepsi.stages``), stage health from the dispatchers'
heartbeats. pepsi-httpd needs a DSN and nothing of the dispatcher's
configuration.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.errors import NoDataFound, ObjectNotInPrerequisiteState
from psycopg.rows import dict_row

from .ring import SampleRing

log = logging.getLogger(__name__)

#: Seconds a snapshot is served from memory: a scrape costs at most one query a second.
CACHE_SECONDS = 1.0
#: The sampler takes a snapshot this often, so the charts have a history
#: when someone opens the dashboard (one query per SAMPLE_EVERY seconds at most).
SAMPLE_EVERY = 5.0
#: Rows on one page of the dashboard's message list unless ``limit`` asks for
#: more (at most pepsi.list_messages' cap, MESSAGE_LIST_MAX_ROWS).
LIST_ROWS = 100
#: Rows of one failure group on ``/api/failures``.
FAILED_ROWS = 1000
#: Default of --held-off-limit: a stage with pending messages held off longer
#: than this makes /healthz answer 503.
HELD_OFF_LIMIT = 60.0
#: Stage health states that mean "not serving" (stage_health).
HELD_STATES = ("held_off", "no_worker")

MIGRATE_HINT = "run `pepsi-queue migrate`"


class DatabaseDown(Exception):
    """The database did not answer, or refused to; the message is the whole line to show."""


class ActionRefused(DatabaseDown):
    """The database refused the request's data (SQLSTATE class 22: an unknown stage,
    a bad value): the client's mistake, answered 400 with the database's reason."""


def _refused(exc: psycopg.Error, user: str) -> str:
    """One line for an error the database answered with (permission, no schema)."""
    msg = (exc.diag.message_primary or str(exc)).strip()
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return f"database refused: {msg}; GRANT pepsi_dashboard TO {user}"
    if isinstance(exc, psycopg.errors.InvalidSchemaName | psycopg.errors.UndefinedFunction):
        return (
            "the database is not migrated (no pepsi schema, or an older one without the"
            f" dashboard's functions): {MIGRATE_HINT} ({msg})"
        )
    return f"database refused: {msg}"


@dataclass
class Snapshot:
    data: dict[str, Any]
    taken: float  # monotonic
    seconds: float  # how long the query took


def held_too_long(data: dict[str, Any], limit: float) -> list[dict[str, Any]]:
    """Stages with pending messages held off (or with no worker) for longer than ``limit`` s."""
    return [
        h
        for h in data.get("stage_health") or []
        if h.get("state") in HELD_STATES
        and (h.get("pending") or 0) > 0
        and (h.get("held_seconds") or 0.0) > limit
    ]


class App:
    def __init__(
        self, dsn: str, allow_actions: bool, held_off_limit: float = HELD_OFF_LIMIT
    ) -> None:
        self.dsn = dsn
        self.allow_actions = allow_actions
        self.held_off_limit = held_off_limit
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()
        self._snap: Snapshot | None = None
        self._snap_lock = threading.Lock()
        self.samples = SampleRing()
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample_loop, name="sampler", daemon=True)

    def start_sampler(self) -> None:
        self._sampler.start()

    def _sample_loop(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            try:
                self.snapshot()  # appends a sample unless a request just did
            except DatabaseDown as exc:
                log.debug("sampler: %s", exc)

    # -- database -----------------------------------------------------------------
    def _connect(self) -> psycopg.Connection:
        conn = psycopg.connect(
            self.dsn,
            autocommit=True,
            application_name="pepsi-httpd",
            connect_timeout=5,
            row_factory=dict_row,
        )
        conn.execute("SET statement_timeout = '10s'")
        if not self.allow_actions:
            # Belt and braces: without --allow-actions nothing this process sends can write.
            conn.execute("SET default_transaction_read_only = on")
        return conn

    def query(
        self, sql: str, params: tuple[Any, ...] | dict[str, Any] = ()
    ) -> list[dict[str, Any]]:
        """Run one statement (reconnecting once if the connection was lost)."""
        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._conn is None or self._conn.closed:
                        self._conn = self._connect()
                    return self._conn.execute(sql, params).fetchall()
                except (ObjectNotInPrerequisiteState, NoDataFound) as exc:  # reschedule's refusals
                    hint = f" ({exc.diag.message_hint})" if exc.diag.message_hint else ""
                    raise ActionRefused(f"{exc.diag.message_primary}{hint}") from None
                except psycopg.OperationalError as exc:
                    if self._conn is not None:
                        self._conn.close()
                    self._conn = None
                    if attempt == 2:
                        first = str(exc).strip().splitlines()[0]
                        raise DatabaseDown(f"database unavailable: {first}") from None
                except psycopg.DataError as exc:  # the request's data: the client's
                    raise ActionRefused(_refused(exc, "?")) from None
                except psycopg.Error as exc:  # it answered, with an error: no retry
                    user = self._conn.info.user if self._conn is not None else "?"
                    raise DatabaseDown(_refused(exc, user)) from None
            raise AssertionError("unreachable")

    def check_database(self) -> str | None:
        """At start: None when the database answers at head, else the line saying why not.

        A DSN that does not parse raises ``psycopg.ProgrammingError`` (the caller
        exits 2: nothing would ever work).
        """
        psycopg.conninfo.conninfo_to_dict(self.dsn)  # raises on a malformed DSN
        try:
            self.snapshot()
        except DatabaseDown as exc:
            return str(exc)
        return None

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- the snapshot ---------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The cached snapshot, refreshed when older than CACHE_SECONDS."""
        with self._snap_lock:
            now = time.monotonic()
            if self._snap is not None and now - self._snap.taken < CACHE_SECONDS:
                return self._snap
            t0 = time.monotonic()
            rows = self.query("SELECT pepsi.dashboard_snapshot() AS s")
            snap = Snapshot(rows[0]["s"], time.monotonic(), time.monotonic() - t0)
            self._snap = snap
            self.samples.add(snap.data)
            return snap

    def invalidate(self) -> None:
        with self._snap_lock:
            self._snap = None

    # -- views ----------------------------------------------------------------------
    def graph(self, data: dict[str, Any]) -> dict[str, Any]:
        """The stages of the registry the dispatcher wrote, with health and PAUSED.

        Stages that have rows but are not registered (a stage a reload removed)
        are shown too, without edges.
        """
        health = {h["stage"]: h for h in data.get("stage_health") or []}
        overlay_paused = {
            section[len("stage-") :]
            for section, option, value in data.get("overlay") or []
            if section.startswith("stage-")
            and option.upper() == "PAUSED"
            and str(value).strip().lower() in ("yes", "true", "on", "1")
        }
        stages: dict[str, Any] = {}
        for s in data.get("stages") or []:
            name = s["stage"]
            h = health.get(name) or {}
            stages[name] = {
                "name": name,
                "next": list(s.get("next") or []),
                "registered": True,
                "paused": h.get("state") == "paused" or name in overlay_paused,
                "parallelism": s.get("parallelism"),
                "queue_limit": s.get("queue_limit"),
                "max_retries": s.get("max_retries"),
                "health": h,
            }
        for q in data.get("queue") or []:
            if q["stage"] not in stages:
                stages[q["stage"]] = {
                    "name": q["stage"],
                    "next": [],
                    "registered": False,
                    "paused": q["stage"] in overlay_paused,
                    "health": health.get(q["stage"]) or {},
                }
        return stages

    def overview(self) -> dict[str, Any]:
        snap = self.snapshot()
        data = snap.data
        counts: dict[str, dict[str, int]] = {}
        for q in data.get("queue") or []:
            c = counts.setdefault(q["stage"], {})
            key = "failed" if q["status"] in ("failed", "timeout", "expired") else q["status"]
            c[key] = c.get(key, 0) + q["count"]
        live = [d for d in data.get("dispatchers") or [] if d.get("live")]
        return {
            "allow_actions": self.allow_actions,
            "stages": self.graph(data),
            "counts": counts,
            "oldest_pending": data.get("oldest_pending") or {},
            "retries_due": data.get("retries_due") or {},
            "stage_stats": data.get("stage_stats") or [],
            "totals": data.get("totals") or {},
            "dispatchers": [
                {k: v for k, v in d.items() if k != "gauges"}
                | {"workers": (d.get("gauges") or {}).get("workers", {})}
                for d in data.get("dispatchers") or []
            ],
            "dispatcher_live": bool(live) and bool(data.get("dispatcher_session", True)),
            "held_off_limit": self.held_off_limit,
            "held_too_long": held_too_long(data, self.held_off_limit),
            "failure_reasons": data.get("failure_reasons") or [],
            "samples": self.samples.as_list(),
            "now": data.get("now"),
        }

    def messages(
        self,
        status: str | None,
        stage: str | None,
        older_than: float | None,
        match: str | None,
        group: str | None,
        limit: int,
        before: int | None,
    ) -> list[dict[str, Any]]:
        """One page of ``pepsi.list_messages``, as ``pepsi-queue list`` reads it (match: a
        JSON object text; the payload cut to a 200-character preview here)."""
        return self.query(
            "SELECT workqueue_id, stage, status, kind, retries,"
            " extract(epoch FROM due)::float8 AS due, reason,"
            " left(payload::text, 200) AS payload_preview,"
            " extract(epoch FROM created_at)::float8 AS created_at,"
            " extract(epoch FROM updated_at)::float8 AS updated_at"
            " FROM pepsi.list_messages(statuses => %s::text[], in_stage => %s,"
            " older_than => make_interval(secs => %s::float8), payload_contains => %s::jsonb,"
            " reason_group => %s, max_rows => %s, before_id => %s)",
            ([status] if status else None, stage, older_than, match, group, limit, before),
        )

    def failed(self, reason: str | None, stage: str | None) -> list[dict[str, Any]]:
        """Failed rows whose raw reason is ``reason`` (``/api/failures``, kept for scripts)."""
        return self.query(
            "SELECT workqueue_id, stage, status, retries, error,"
            " extract(epoch FROM updated_at)::float8 AS updated_at"
            " FROM pepsi.dashboard_failed(%s, %s, %s)",
            (reason, stage, FAILED_ROWS),
        )

    def message(self, wid: int) -> dict[str, Any] | None:
        """One message (``dashboard_message``) with its attempt history
        (``message_history``, oldest first) and its stage's MAX_RETRIES."""
        m = self.query("SELECT pepsi.dashboard_message(%s) AS m", (wid,))[0]["m"]
        if m is None:
            return None
        m["history"] = self.query(
            "SELECT attempt, stage, outcome, reason, traceback,"
            " extract(epoch FROM started_at)::float8 AS started_at,"
            " extract(epoch FROM ended_at)::float8 AS ended_at"
            " FROM pepsi.message_history(%s)",
            (wid,),
        )
        stages = {s["stage"]: s for s in self.snapshot().data.get("stages") or []}
        m["max_retries"] = (stages.get(m["stage"]) or {}).get("max_retries")
        return m

    # -- actions (only with --allow-actions; each one SQL function) --------------------
    def requeue(self, ids: list[int]) -> int:
        n = self.query("SELECT pepsi.dashboard_requeue(%s::bigint[]) AS n", (ids,))[0]["n"]
        self.invalidate()
        return n

    def cancel(self, ids: list[int]) -> int:
        n = self.query("SELECT pepsi.dashboard_cancel(%s::bigint[]) AS n", (ids,))[0]["n"]
        self.invalidate()
        return n

    def bulk(
        self,
        action: str,
        filters: tuple[str | None, str | None, float | None, str | None, str | None],
        before: int | None,
        dry_run: bool = False,
    ) -> tuple[int, int, int | None]:
        """``requeue_matching`` / ``cancel_matching`` on the list's filters (status,
        stage, older_than seconds, where JSON, reason group): (matched, acted,
        newest_id). ``dry_run`` only counts (it writes nothing: also read-only)."""
        status, stage, older_than, match, group = filters
        args = {
            "statuses": [status] if status else None,
            "stage": stage,
            "older": older_than,
            "where": match,
            "group": group,
            "before": before,
            "dry_run": dry_run,
        }
        common = (
            "statuses => %(statuses)s::text[], in_stage => %(stage)s,"
            " older_than => make_interval(secs => %(older)s::float8),"
            " payload_contains => %(where)s::jsonb, before_id => %(before)s,"
            " dry_run => %(dry_run)s"
        )
        if action == "requeue":
            sql = f"SELECT * FROM pepsi.requeue_matching({common}, reason_group => %(group)s)"
        elif group is not None:
            raise ActionRefused("cancel takes no reason group: that filter selects failed rows")
        else:
            sql = f"SELECT * FROM pepsi.cancel_matching({common})"
        row = self.query(sql, args)[0]
        if not dry_run:
            self.invalidate()
        return row["matched"], row["acted"], row["newest_id"]

    def reschedule(self, wid: int, in_seconds: float) -> float | None:
        """``dashboard_reschedule``: due ``in_seconds`` from now (0: now); the new due
        time (epoch seconds). A running or terminal message raises ActionRefused."""
        due = self.query(
            "SELECT extract(epoch FROM pepsi.dashboard_reschedule(%s,"
            " now() + make_interval(secs => %s::float8)))::float8 AS due",
            (wid, in_seconds),
        )[0]["due"]
        self.invalidate()
        return due

    def schedules(self) -> list[dict[str, Any]]:
        """``dashboard_schedules``: name, stage, spec, last_tick, next_tick of each schedule."""
        return self.query("SELECT pepsi.dashboard_schedules() AS s")[0]["s"]

    def pause(self, stage: str, paused: bool) -> bool:
        """``pause_stage`` (as ``pepsi-queue pause/resume``): True when the overlay
        changed. Resuming also ends the stage's hold-off (the Try now button)."""
        changed = self.query("SELECT pepsi.pause_stage(%s, %s) AS c", (stage, paused))[0]["c"]
        self.invalidate()
        return changed

    def paused_map(self, data: dict[str, Any]) -> dict[str, bool]:
        return {name: s["paused"] for name, s in self.graph(data).items()}
