"""Rates that are rates: the statistics readers follow what is done within seconds.

The dispatcher flushes pepsi.stage_stats every STATS_INTERVAL (60 s here)
or when it goes idle; while a stage stays busy, nothing is flushed. The
dashboard's chart, status --watch and /metrics' pepsi_stage_*_total read
the statistics plus the live dispatchers' unflushed deltas (their gauges),
so they count the messages done meanwhile.
"""

from __future__ import annotations

import json

from dispatch_harness import Harness, harness_fixture, wait_until  # noqa: F401


def flushed(h: Harness) -> int:
    row = h.conn.execute("SELECT processed FROM pepsi.stage_stats WHERE stage = 'a'").fetchone()
    return row[0] if row else 0


def live(h: Harness) -> int:
    stats = h.conn.execute("SELECT pepsi.dashboard_snapshot() -> 'stage_stats'").fetchone()[0]
    return next((s["processed"] for s in stats if s["stage"] == "a"), 0)


def overview(h: Harness) -> int:
    row = h.conn.execute(
        "SELECT processed_total FROM pepsi.queue_overview() WHERE stage = 'a'"
    ).fetchone()
    return row[0] if row else 0


def test_a_busy_stages_counters_move_before_the_statistics_flush(h: Harness) -> None:
    h.start(h.conf(h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=1), STATS_INTERVAL="60 s"))
    ids = h.enqueue("a", [{"do": "sleep:0.25;next"}] * 40)  # about 10 s of steady work
    wait_until(lambda: live(h) >= 5, 8, message=lambda: f"live {live(h)}, flushed {flushed(h)}")
    assert flushed(h) == 0, "the stage is busy: nothing flushed yet, the count is live"
    assert overview(h) >= 5, "status --watch reads the same live counters"
    seen = [live(h)]
    for _ in range(5):
        wait_until(lambda: live(h) > seen[-1], 5, message="the live counter keeps moving")
        seen.append(live(h))
    assert seen == sorted(seen)
    h.wait_all("done", timeout=60)
    # Idle: the flush writes the statistics and the gauges without those
    # deltas in one statement; the live counter neither jumps nor drops.
    wait_until(lambda: flushed(h) == len(ids), 10, message="the idle flush")
    assert live(h) == len(ids), json.dumps({"live": live(h), "flushed": flushed(h)})
