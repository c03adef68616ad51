"""The dispatcher's in-memory gauges, sent with each heartbeat (``pepsi.heartbeat`` v3).

pepsi-httpd reads them from ``pepsi.dispatchers.gauges`` and exports them on
``/metrics`` (see docs/OPERATIONS.md); ``pepsi.stage_health`` reads each
stage's health from them. This keeps HTTP out of the dispatcher's loop: the
gauges ride on a write it does anyway, once per heartbeat interval, and the
loop sends them early (at most once a second) when :func:`signature` changes
-- a worker started or stopped, a stage held off or serving again -- so they
are current within about a second of a change, not POLL_INTERVAL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pepsi_dispatch.contract import INF
from pepsi_dispatch.coordinator.stats import Stats
from pepsi_dispatch.coordinator.workers.stage_pool import StagePool


def worker_state(w: Any) -> str:
    """busy (has ids in flight), idle, retiring or stopping."""
    if w.stopping:
        return "stopping"
    if w.retiring:
        return "retiring"
    return "busy" if w.inflight else "idle"


#: Changed gauges (workers started or stopped, a stage held off) go out this
#: soon at the earliest, ahead of the heartbeat: at most one extra write a second.
EARLY_MIN_INTERVAL = 1.0


class EarlyGauges:
    """When changed gauges go out ahead of the heartbeat (rate-limited)."""

    def __init__(self, min_interval: float = EARLY_MIN_INTERVAL) -> None:
        self.min_interval = min_interval
        self.sent_at = -INF
        self.sent: tuple[Any, ...] = ()
        #: when changed gauges may go out (INF: none are waiting); a loop timer.
        self.due = INF

    def should_send(self, now: float, sig: tuple[Any, ...]) -> bool:
        """Send now? No if nothing changed since the last send, or too soon after it."""
        if sig == self.sent:
            self.due = INF
            return False
        if now < self.sent_at + self.min_interval:
            self.due = self.sent_at + self.min_interval
            return False
        self.due = INF
        return True

    def sent_now(self, now: float, sig: tuple[Any, ...]) -> None:
        self.sent_at, self.sent, self.due = now, sig, INF


def signature(pools: Mapping[str, StagePool], leftover: Iterable[StagePool]) -> tuple[Any, ...]:
    """What, when it changes, is worth an early heartbeat: per stage, its worker
    processes by state and its health state (not the seconds held off)."""
    out: list[Any] = []
    for pool in [*pools.values(), *leftover]:
        states = [0, 0, 0, 0]
        for w in pool.workers:
            states[_STATE_INDEX[worker_state(w)]] += 1
        health = "paused" if pool.config.paused else pool.held_since is not None
        out.append((pool.name, *states, health, len(pool.workers) == 0, pool.held_cause))
    return tuple(out)


_STATE_INDEX = {"busy": 0, "idle": 1, "retiring": 2, "stopping": 3}


def collect(
    pools: Mapping[str, StagePool],
    leftover: Iterable[StagePool],
    inflight_ids: int,
    round_trips: int,
    stats: Stats,
    heartbeat_interval: float,
    now: float,
) -> dict[str, Any]:
    """A JSON-able snapshot of the gauges and since-start counters: the live
    stage ``pools`` (and the ``leftover`` pools of stages a reload removed),
    each stage's health at ``now`` (monotonic), the ids held, the database
    round trips and the statistics."""
    workers: dict[str, dict[str, int]] = {}
    inflight: dict[str, int] = {}
    for pool in [*pools.values(), *leftover]:
        states = workers.setdefault(pool.name, {"busy": 0, "idle": 0, "retiring": 0, "stopping": 0})
        for w in pool.workers:
            states[worker_state(w)] += 1
            inflight[pool.name] = inflight.get(pool.name, 0) + len(w.inflight)
    for name in pools:
        inflight.setdefault(name, 0)
    st = stats
    return {
        "heartbeat_interval": heartbeat_interval,
        "workers": workers,
        "inflight": inflight,
        "inflight_ids": inflight_ids,
        "paused_stages": sorted(n for n, p in pools.items() if p.config.paused),
        "stages": {name: pool.health(now) for name, pool in pools.items()},
        "round_trips": round_trips,
        "claims": st.claims,
        "messages": st.total_messages,
        "stage_runs": st.total_stage_runs,
        "db_round_trip_seconds": st.db_seconds.as_dict(),
        "service_seconds": {name: h.as_dict() for name, h in st.service.items()},
        "unflushed": st.unflushed(),
    }
