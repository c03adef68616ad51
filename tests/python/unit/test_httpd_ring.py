"""The dashboard's chart ring: an hour of history whatever the scrape rate, in bounded memory."""

from __future__ import annotations

import json
import tracemalloc
from decimal import Decimal

from pepsi_dispatch.coordinator.stats import SERVICE_BUCKETS
from pepsi_dispatch.httpd.ring import RING_SECONDS, SampleRing

STAGES = ("a", "b", "c")


def snapshot(t: float, n: int) -> dict:
    """A ``dashboard_snapshot()`` as psycopg returns it: three stages, one live
    dispatcher with a service histogram per stage, counts in the millions."""
    hist = {
        "bounds": list(SERVICE_BUCKETS),
        "counts": [1_000_000 + 37 * n + k for k in range(len(SERVICE_BUCKETS) + 1)],
        "sum": 12.5,
    }
    data = {
        "now": Decimal(str(t)),
        "stage_stats": [
            {
                "stage": s,
                "processed": 5_000_000 + n,
                "failed": 1000 + n,
                "timeouts": 3,
                "crashes": 1,
            }
            for s in STAGES
        ],
        "queue": [
            {"stage": s, "status": st, "count": 1000 + n}
            for s in STAGES
            for st in ("done", "pending", "running", "failed")
        ],
        "dispatchers": [
            {"live": True, "gauges": {"service_seconds": {s: hist for s in STAGES}}},
            {"live": False, "gauges": {"service_seconds": {"a": hist}}},
        ],
    }
    # A fresh object graph per snapshot, as each query's JSON decode makes.
    return json.loads(json.dumps(data, default=float), parse_float=float)


def test_a_sample_keeps_the_shape_the_dashboard_reads() -> None:
    ring = SampleRing()
    ring.add(snapshot(1000.0, 1))
    (s,) = ring.as_list()
    assert s["t"] == 1000.0
    assert s["processed"] == 3 * 5_000_001
    assert s["failed"] == 3 * (1001 + 3 + 1)
    assert (s["done"], s["pending"], s["running"], s["failed_rows"]) == (3003, 3003, 3003, 3003)
    assert set(s["stages"]) == set(STAGES)
    a = s["stages"]["a"]
    assert (a["processed"], a["failures"]) == (5_000_001, 1005)
    # Only the live dispatcher's histogram counts.
    assert a["service"]["bounds"] == list(SERVICE_BUCKETS)
    assert a["service"]["counts"][0] == 1_000_037
    json.dumps(s)  # plain JSON types only


def test_two_live_dispatchers_histograms_are_summed() -> None:
    data = snapshot(1.0, 0)
    data["dispatchers"][1]["live"] = True
    ring = SampleRing()
    ring.add(data)
    a = ring.as_list()[0]["stages"]["a"]["service"]["counts"]
    assert a[0] == 2 * 1_000_000


def test_a_stage_with_no_histogram_has_no_service() -> None:
    data = snapshot(1.0, 0)
    data["dispatchers"] = []
    ring = SampleRing()
    ring.add(data)
    assert "service" not in ring.as_list()[0]["stages"]["a"]


def test_an_hour_is_kept_at_one_scrape_a_second() -> None:
    """The dashboard's longest window is 1 h; a count of 1,800 kept only 30 min of it."""
    ring = SampleRing()
    for n in range(5000):
        ring.add(snapshot(10_000.0 + n, n))
    kept = ring.as_list()
    span = kept[-1]["t"] - kept[0]["t"]
    assert RING_SECONDS - 1 <= span <= RING_SECONDS


def test_samples_older_than_the_hour_are_dropped_at_a_slow_rate() -> None:
    ring = SampleRing()
    for n in range(200):
        ring.add(snapshot(n * 60.0, n))  # one a minute for 200 minutes
    kept = ring.as_list()
    assert kept[-1]["t"] - kept[0]["t"] <= RING_SECONDS
    assert len(kept) == 61


def test_an_hour_of_samples_stays_small() -> None:
    """An hour at one snapshot a second with three stages: a few MB, not tens."""
    ring = SampleRing()
    snaps = [snapshot(float(n), n) for n in range(1000)]
    tracemalloc.start()
    try:
        for s in snaps:
            ring.add(s)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    per_sample = held / 1000
    assert per_sample < 1500, f"{per_sample:.0f} B a sample"
