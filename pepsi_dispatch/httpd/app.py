"""pepsi-httpd's state: one database connection, the 1 s snapshot cache, the ring of samples.

Thread-safe: ThreadingHTTPServer serves each request in a thread; the
connection is used under a lock (a scrape is one call, so requests wait at
most one snapshot query for each other).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from ..config import Config, ConfigError, apply_overlay

log = logging.getLogger(__name__)

#: Seconds a snapshot is served from memory: a scrape costs at most one query a second.
CACHE_SECONDS = 1.0
#: Samples kept for the throughput chart (one per snapshot, at most one a second).
RING_SIZE = 600
#: The sampler takes a snapshot this often, so the throughput chart has a history
#: when someone opens the dashboard (one query per SAMPLE_EVERY seconds at most).
SAMPLE_EVERY = 5.0
#: Rows on the dashboard's failures list.
FAILED_ROWS = 200


class DatabaseDown(Exception):
    """The database did not answer, or refused to (message says why)."""


class ActionRefused(DatabaseDown):
    """The database refused the request's data (SQLSTATE class 22: an unknown stage,
    a bad value): the client's mistake, answered 400 with the database's reason."""


def _refused(exc: psycopg.Error, user: str) -> str:
    """One line for an error the database answered with (permission, no schema)."""
    msg = (exc.diag.message_primary or str(exc)).strip()
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return f"{msg}; GRANT pepsi_dashboard TO {user}"
    return msg


@dataclass
class Snapshot:
    data: dict[str, Any]
    taken: float  # monotonic
    seconds: float  # how long the query took


class App:
    def __init__(self, config: Config, allow_actions: bool) -> None:
        self.config = config
        self.allow_actions = allow_actions
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()
        self._snap: Snapshot | None = None
        self._snap_lock = threading.Lock()
        self.samples: deque[dict[str, Any]] = deque(maxlen=RING_SIZE)
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
            self.config.dsn,
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

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """Run one statement (reconnecting once if the connection was lost)."""
        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._conn is None or self._conn.closed:
                        self._conn = self._connect()
                    return self._conn.execute(sql, params).fetchall()
                except psycopg.OperationalError as exc:
                    if self._conn is not None:
                        self._conn.close()
                    self._conn = None
                    if attempt == 2:
                        raise DatabaseDown(str(exc).strip().splitlines()[0]) from None
                except psycopg.DataError as exc:  # the request's data: the client's
                    raise ActionRefused(_refused(exc, "?")) from None
                except psycopg.Error as exc:  # it answered, with an error: no retry
                    user = self._conn.info.user if self._conn is not None else "?"
                    raise DatabaseDown(_refused(exc, user)) from None
            raise AssertionError("unreachable")

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
            self._sample(snap.data)
            return snap

    def invalidate(self) -> None:
        with self._snap_lock:
            self._snap = None

    def _sample(self, data: dict[str, Any]) -> None:
        stats = data.get("stage_stats") or []
        by_status: dict[str, int] = {}
        for q in data.get("queue") or []:
            by_status[q["status"]] = by_status.get(q["status"], 0) + q["count"]
        self.samples.append(
            {
                "t": data.get("now"),
                "processed": sum(s["processed"] for s in stats),
                "failed": sum(s["failed"] + s["timeouts"] + s["crashes"] for s in stats),
                "done": by_status.get("done", 0),
                "pending": by_status.get("pending", 0),
                "running": by_status.get("running", 0),
            }
        )

    # -- views ----------------------------------------------------------------------
    def graph(self, data: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """Stages of the configuration with the database overlay on top."""
        error = None
        config = self.config
        try:
            config = apply_overlay(config, [tuple(r) for r in data.get("overlay") or []])
        except ConfigError as exc:
            error = f"the database overlay does not apply: {exc}"
        stages = {
            s.name: {
                "name": s.name,
                "next": list(s.next),
                "paused": s.paused,
                "parallelism": s.parallelism,
                "queue_limit": s.queue_limit,
            }
            for s in config.stages.values()
        }
        return stages, error

    def overview(self) -> dict[str, Any]:
        snap = self.snapshot()
        data = snap.data
        stages, error = self.graph(data)
        counts: dict[str, dict[str, int]] = {}
        for q in data.get("queue") or []:
            c = counts.setdefault(q["stage"], {})
            key = "failed" if q["status"] in ("failed", "timeout", "expired") else q["status"]
            c[key] = c.get(key, 0) + q["count"]
        return {
            "allow_actions": self.allow_actions,
            "stages": stages,
            "config_error": error,
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
            "failure_reasons": data.get("failure_reasons") or [],
            "samples": list(self.samples),
            "now": data.get("now"),
        }

    def failed(self, reason: str | None, stage: str | None) -> list[dict[str, Any]]:
        rows = self.query(
            "SELECT workqueue_id, stage, status, retries, error,"
            " extract(epoch FROM updated_at)::float8 AS updated_at"
            " FROM pepsi.dashboard_failed(%s, %s, %s)",
            (reason, stage, FAILED_ROWS),
        )
        return rows

    def message(self, wid: int) -> dict[str, Any] | None:
        rows = self.query("SELECT pepsi.dashboard_message(%s) AS m", (wid,))
        return rows[0]["m"]

    # -- actions (only with --allow-actions; each one SQL function) --------------------
    def requeue(self, ids: list[int]) -> int:
        n = self.query("SELECT pepsi.dashboard_requeue(%s::bigint[]) AS n", (ids,))[0]["n"]
        self.invalidate()
        return n

    def cancel(self, ids: list[int]) -> int:
        n = self.query("SELECT pepsi.dashboard_cancel(%s::bigint[]) AS n", (ids,))[0]["n"]
        self.invalidate()
        return n

    def pause(self, stage: str, paused: bool) -> bool:
        changed = self.query("SELECT pepsi.dashboard_pause_stage(%s, %s) AS c", (stage, paused))[0][
            "c"
        ]
        self.invalidate()
        return changed

    def paused_map(self, data: dict[str, Any]) -> dict[str, bool]:
        stages, _ = self.graph(data)
        return {name: s["paused"] for name, s in stages.items()}
