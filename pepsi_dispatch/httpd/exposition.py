"""/metrics: Prometheus text built from one ``pepsi.dashboard_snapshot()`` with prometheus_client.

The only renderer of pepsi-dispatch's metrics: every family and its help text
is written here once (docs/OPERATIONS.md's table lists them, checked by
tests/python/unit/test_metrics_one_source.py). The stage and queue
counters, the queue's depth and oldest rows, the retries due, live dispatchers and
the dispatchers' own gauges (sent with their heartbeats).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

STAGE_COUNTERS = (
    ("processed", "Messages a stage processed successfully."),
    ("failed", "Messages that failed at a stage."),
    ("timeouts", "Messages that hit MAX_RUNTIME at a stage."),
    ("crashes", "Worker crashes at a stage."),
    ("processing_seconds", "Seconds workers of a stage spent on messages."),
)
GLOBAL_COUNTERS = (
    ("stage_runs", "Stage executions, fused ones included."),
    ("messages", "Message ids handed to workers."),
    ("failed", "Messages failed, all stages."),
    ("timeouts", "Messages timed out, all stages."),
    ("crashes", "Worker crashes, all stages."),
    ("requeued", "Paused messages flipped back to pending."),
    ("expired", "Messages expired (older than EXPIRY)."),
)


def _histogram(
    name: str, doc: str, labels: list[str], items: Iterable[tuple[list[str], dict[str, Any]]]
) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=labels)
    for values, h in items:
        bounds, counts = h.get("bounds") or [], h.get("counts") or []
        if len(counts) != len(bounds) + 1:
            continue
        cumulative, buckets = 0, []
        for bound, n in zip([*bounds, float("inf")], counts, strict=True):
            cumulative += n
            buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
        fam.add_metric(values, buckets, float(h.get("sum") or 0.0))
    return fam


def families(snap: dict[str, Any], paused: dict[str, bool], sql_seconds: float) -> Iterator[Metric]:
    """Every metric family of one snapshot (``paused``: stage -> PAUSED in the config)."""
    yield GaugeMetricFamily("pepsi_database_up", "1 when the database answered.", value=1)
    yield GaugeMetricFamily(
        "pepsi_httpd_snapshot_seconds",
        "Time the last dashboard_snapshot() call took (pepsi-httpd caches it for 1 s).",
        value=sql_seconds,
    )
    stats = snap.get("stage_stats") or []
    for col, doc in STAGE_COUNTERS:
        fam = CounterMetricFamily(f"pepsi_stage_{col}", doc, labels=["stage"])
        for s in stats:
            fam.add_metric([s["stage"]], float(s[col]))
        yield fam
    totals = snap.get("totals") or {}
    for name, doc in GLOBAL_COUNTERS:
        yield CounterMetricFamily(f"pepsi_queue_{name}", doc, value=float(totals.get(name, 0)))
    now = float(snap.get("now") or time.time())
    yield from _queue_families(snap, now)
    due = GaugeMetricFamily(
        "pepsi_queue_retries_due",
        "Paused rows whose time has come (requeue_due flips them to pending).",
        labels=["stage"],
    )
    for stage, n in sorted((snap.get("retries_due") or {}).items()):
        due.add_metric([stage], n)
    yield due
    fam = GaugeMetricFamily(
        "pepsi_stage_paused", "1 when the stage is PAUSED (claims nothing).", labels=["stage"]
    )
    for stage, is_paused in sorted(paused.items()):
        fam.add_metric([stage], 1 if is_paused else 0)
    yield fam
    yield from _health_families(snap, now)
    yield from _liveness_families(snap)
    yield from _dispatcher_families(snap.get("dispatchers") or [], now)


def _queue_families(snap: dict[str, Any], now: float) -> Iterator[Metric]:
    """The queue's depth by stage and status, and when its oldest rows changed."""
    depth = GaugeMetricFamily(
        "pepsi_queue_depth",
        "Rows in pepsi.workqueue by stage and status.",
        labels=["stage", "status"],
    )
    for q in snap.get("queue") or []:
        depth.add_metric([q["stage"], q["status"]], q["count"])
    yield depth
    age = GaugeMetricFamily(
        "pepsi_queue_oldest_age_seconds",
        "Seconds since the oldest row of a stage and status last changed (0 when none).",
        labels=["stage", "status"],
    )
    for q in snap.get("queue") or []:
        age.add_metric([q["stage"], q["status"]], float(q.get("oldest_age") or 0.0))
    yield age
    oldest = GaugeMetricFamily(
        "pepsi_queue_oldest_timestamp_seconds",
        "Unix time the oldest row of a stage and status last changed (no series when none).",
        labels=["stage", "status"],
    )
    for q in snap.get("queue") or []:
        if q.get("count"):
            oldest.add_metric([q["stage"], q["status"]], now - float(q.get("oldest_age") or 0.0))
    yield oldest
    pending = GaugeMetricFamily(
        "pepsi_queue_oldest_pending_timestamp_seconds",
        "Unix time the oldest pending row of a stage became pending (no series when none):"
        " time() minus it is the wait of the longest-waiting message.",
        labels=["stage"],
    )
    counts = {(q["stage"], q["status"]): q.get("count") for q in snap.get("queue") or []}
    for stage, seconds in sorted((snap.get("oldest_pending") or {}).items()):
        if counts.get((stage, "pending"), 1):
            pending.add_metric([stage], now - float(seconds))
    yield pending


#: The states of pepsi.stage_health, each a series of pepsi_stage_health.
HEALTH_STATES = ("serving", "held_off", "no_worker", "paused", "unknown")


def _health_families(snap: dict[str, Any], now: float) -> Iterator[Metric]:
    """Each stage's health as its dispatchers report it (one series per state, 1 or 0)."""
    state = GaugeMetricFamily(
        "pepsi_stage_health",
        "1 for the stage's current health state: serving, held_off (new workers held off"
        " after a failure), no_worker (held off and no worker running), paused, unknown"
        " (no live dispatcher reports the stage); 0 for the others.",
        labels=["stage", "state"],
    )
    held = GaugeMetricFamily(
        "pepsi_stage_held_off_since_timestamp_seconds",
        "Unix time the stage was held off (held_off or no_worker); no series otherwise.",
        labels=["stage"],
    )
    for h in snap.get("stage_health") or []:
        for s in HEALTH_STATES:
            state.add_metric([h["stage"], s], 1 if h.get("state") == s else 0)
        if h.get("state") in ("held_off", "no_worker"):
            held.add_metric([h["stage"]], now - float(h.get("held_seconds") or 0.0))
    yield state
    yield held


def _liveness_families(snap: dict[str, Any]) -> Iterator[Metric]:
    """Registered and live dispatchers, and whether a session serves the database."""
    dispatchers = snap.get("dispatchers") or []
    yield GaugeMetricFamily(
        "pepsi_dispatchers_live",
        "Live dispatchers: registered, their session connected.",
        value=sum(1 for d in dispatchers if d.get("live")),
    )
    if "dispatcher_session" in snap:  # migration 0016
        yield GaugeMetricFamily(
            "pepsi_dispatcher_session",
            "1 while a session holds the dispatcher lock (a dispatcher is connected and"
            " serving); 0 at once when it is killed, while its heartbeat still looks fresh.",
            value=1 if snap["dispatcher_session"] else 0,
        )


def dispatcher_labels(dispatchers: list[dict[str, Any]]) -> dict[int, str]:
    """The ``dispatcher`` label of each: its host name, stable across restarts (a
    registration id is new at each start, and every restart would begin new
    series); ``host:pid`` for dispatchers that share a host; ``host:pid:id``
    for those that share both (registrations a heartbeat re-created after a
    replica declared them dead carry no host or pid of their own), so no two
    series of one scrape share their labels."""
    hosts = [str(d.get("hostname") or "?") for d in dispatchers]
    by_pid = [
        host if hosts.count(host) == 1 else f"{host}:{d.get('pid')}"
        for d, host in zip(dispatchers, hosts, strict=True)
    ]
    return {
        d["dispatcher_id"]: name if by_pid.count(name) == 1 else f"{name}:{d['dispatcher_id']}"
        for d, name in zip(dispatchers, by_pid, strict=True)
    }


def _dispatcher_families(dispatchers: list[dict[str, Any]], now: float) -> Iterator[Metric]:
    hb = GaugeMetricFamily(
        "pepsi_dispatcher_last_heartbeat_timestamp_seconds",
        "Unix time of the dispatcher's last heartbeat.",
        labels=["dispatcher"],
    )
    names = dispatcher_labels(dispatchers)
    workers = GaugeMetricFamily(
        "pepsi_dispatcher_workers",
        "Worker processes by stage and state (busy, idle, retiring, stopping).",
        labels=["dispatcher", "stage", "state"],
    )
    inflight = GaugeMetricFamily(
        "pepsi_dispatcher_inflight",
        "Message ids handed to workers and not answered yet, by stage.",
        labels=["dispatcher", "stage"],
    )
    inflight_ids, round_trips, claims = _per_dispatcher_families()
    db_hist: list[tuple[list[str], dict[str, Any]]] = []
    service_hist: list[tuple[list[str], dict[str, Any]]] = []
    for d in dispatchers:
        did = names[d["dispatcher_id"]]
        hb.add_metric([did], now - float(d.get("heartbeat_age") or 0.0))
        g = d.get("gauges")
        if not g:
            continue
        for stage, states in sorted((g.get("workers") or {}).items()):
            for state, n in sorted(states.items()):
                workers.add_metric([did, stage, state], n)
        for stage, n in sorted((g.get("inflight") or {}).items()):
            inflight.add_metric([did, stage], n)
        inflight_ids.add_metric([did], g.get("inflight_ids", 0))
        round_trips.add_metric([did], float(g.get("round_trips", 0)))
        claims.add_metric([did], float(g.get("claims", 0)))
        _histograms_of(did, g, db_hist, service_hist)
    yield from (hb, workers, inflight, inflight_ids, round_trips, claims)
    yield _histogram(
        "pepsi_dispatcher_db_round_trip_seconds",
        "Duration of the dispatcher's hot-path database pipelines.",
        ["dispatcher"],
        db_hist,
    )
    yield _histogram(
        "pepsi_dispatcher_service_seconds",
        "Service time of a message at a stage (handed out to answered).",
        ["dispatcher", "stage"],
        service_hist,
    )


def _per_dispatcher_families() -> tuple[Metric, Metric, Metric]:
    inflight_ids = GaugeMetricFamily(
        "pepsi_dispatcher_inflight_ids",
        "Distinct message ids the dispatcher holds in flight.",
        labels=["dispatcher"],
    )
    round_trips = CounterMetricFamily(
        "pepsi_dispatcher_round_trips",
        "Hot-path database pipelines sent since the dispatcher started.",
        labels=["dispatcher"],
    )
    claims = CounterMetricFamily(
        "pepsi_dispatcher_claims",
        "Of those, pipelines that carried a claim.",
        labels=["dispatcher"],
    )
    return inflight_ids, round_trips, claims


def _histograms_of(
    did: str,
    g: dict[str, Any],
    db_hist: list[tuple[list[str], dict[str, Any]]],
    service_hist: list[tuple[list[str], dict[str, Any]]],
) -> None:
    if g.get("db_round_trip_seconds"):
        db_hist.append(([did], g["db_round_trip_seconds"]))
    for stage, h in sorted((g.get("service_seconds") or {}).items()):
        service_hist.append(([did, stage], h))


class _Once(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self.metrics


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def render(metrics: Iterable[Metric]) -> bytes:
    """Prometheus text exposition (0.0.4) of ``metrics``."""
    from prometheus_client.exposition import generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Once(list(metrics)))
    return generate_latest(registry)


def database_down() -> list[Metric]:
    """What /metrics says when the database does not answer."""
    return [GaugeMetricFamily("pepsi_database_up", "1 when the database answered.", value=0)]
