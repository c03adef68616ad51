"""The real dispatcher with automatic retries (RETRY_DELAY), delayed messages
(not_before) and the stage registry it writes at start and on reload."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from dispatch_harness import PYTHON, ROOT, Harness, harness_fixture, wait_until  # noqa: F401

from pepsi_dispatch.enqueue import enqueue


def registry(h: Harness) -> dict[str, tuple]:
    rows = h.conn.execute(
        "SELECT stage, next, max_retries, retry_delay, retry_delay_max"
        " FROM pepsi.registered_stages()"
    ).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


def test_failures_are_retried_with_backoff_then_fail(h: Harness) -> None:
    stages = h.pipeline(["a"], PARALLELISM=2, MAX_RETRIES=3, RETRY_DELAY="200 ms")
    stages["a"]["RETRY_DELAY_MAX"] = "1 s"
    stages["off"] = {"PROGRAM": h.program(), "MAX_RETRIES": 3}
    d = h.start(h.conf(stages))
    want = {
        "a": ([], 3, timedelta(milliseconds=200), timedelta(seconds=1)),
        "off": ([], 3, None, None),
    }
    # (registered right after the dispatcher's own registration, which wait_ready saw)
    wait_until(lambda: registry(h) == want, 10, message=lambda: f"registry {registry(h)}")

    flaky, always, crashy, plain = h.enqueue(
        "a", [{"do": "until:2:fail"}, {"do": "fail"}, {"do": "until:1:exit:3"}, {}]
    )
    (off,) = h.enqueue("off", [{"do": "fail"}])
    h.wait_all(timeout=60)

    row = h.row(flaky)
    assert (row["status"], row["retries"]) == ("done", 2), row
    assert row["state"]["retry_error"] == "3 scripted failure"
    row = h.row(always)
    assert (row["status"], row["retries"]) == ("failed", 3), "retries used up: failed as today"
    assert row["state"]["dispatch_error"] == "3 scripted failure"
    row = h.row(crashy)
    assert (row["status"], row["retries"]) == ("done", 1), "a crash's head is retried too"
    assert "worker exited with code 3" in row["state"]["retry_error"]
    assert h.row(plain)["status"] == "done"
    row = h.row(off)
    assert (row["status"], row["retries"]) == ("failed", 0), "no RETRY_DELAY: today's behaviour"

    # Backoff: the runs of `always` are spaced by ~0.2, 0.4, 0.8 s (jitter ±20 %).
    starts = [r.start for r in h.wlog().runs_of(always)]
    assert len(starts) == 4, starts
    gaps = [(b - a) / 1e9 for a, b in zip(starts, starts[1:], strict=False)]
    assert gaps[0] >= 0.16 and gaps[1] >= 0.32 and gaps[2] >= 0.64, gaps
    assert gaps[2] < 5, gaps

    # Statistics: a retried failure is not a failure; only the final one counts
    # (3 processed: flaky, crashy and plain answered 0 once each; 1 crash).
    def counts() -> tuple:
        a = h.stage_stats().get("a", {})
        return (a.get("processed"), a.get("failed"), a.get("crashes"))

    wait_until(lambda: counts() == (3, 1, 1), 15, message=lambda: f"stage_stats: {counts()}")
    time.sleep(1.5)  # a later idle flush adds nothing
    assert counts() == (3, 1, 1)
    assert h.stage_stats()["off"]["failed"] == 1
    assert d.terminate() == 0


def test_delayed_message_runs_after_not_before_without_a_retry(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a"], MAX_RETRIES=0)))
    (now,) = h.conn.execute("SELECT now()").fetchone()
    mid = enqueue(h.conn, "a", {"k": 1}, not_before=now + timedelta(seconds=1.5))
    row = h.row(mid)
    assert (row["status"], row["retries"]) == ("paused", 0)
    t0 = time.monotonic()
    h.wait_all("done", timeout=20)
    waited = time.monotonic() - t0
    # POLL_INTERVAL is 60 s: the enqueue's notification made the dispatcher
    # learn the due time.
    assert 1.0 <= waited < 6, waited
    row = h.row(mid)
    assert (row["status"], row["retries"]) == ("done", 0), "a delay is not a retry"
    assert "delayed_until" not in row["state"]
    assert d.terminate() == 0


def test_reload_registers_the_new_stage_table(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a", "b"])))
    wait_until(lambda: set(registry(h)) == {"a", "b"}, 10, message="stages registered")
    assert registry(h)["a"][0] == ["b"] and registry(h)["b"][2] is None
    h.set_config("stage-b", "RETRY_DELAY", "3 s")
    h.set_config("stage-c", "PROGRAM", h.program())
    wait_until(
        lambda: "c" in registry(h) and registry(h)["b"][2] == timedelta(seconds=3),
        15,
        message=lambda: f"registry after the overlay changed: {registry(h)}",
    )
    assert d.terminate() == 0


@pytest.mark.parametrize("group_commit", [False, True], ids=["single", "group-commit"])
def test_sdk_handler_exception_is_retried(h: Harness, group_commit: bool) -> None:
    worker = ROOT / "tests/python/support/workers/sdk_scripted_worker.py"
    program = f"{PYTHON} {worker} --stages a" + (" --group-commit" if group_commit else "")
    stages = {
        "a": {"PROGRAM": program, "MAX_RETRIES": 2, "RETRY_DELAY": "100 ms"},
        "plain": {"PROGRAM": program.replace("--stages a", "--stages plain")},
    }
    d = h.start(h.conf(stages))
    wait_until(lambda: set(registry(h)) == {"a", "plain"}, 10, message="stages registered")
    once, always = h.enqueue(
        "a",
        [
            {"plan": {"a": {"op": "raise", "message": "flaky", "below": 1}}},
            {"plan": {"a": {"op": "raise", "message": "broken"}}},
        ],
    )
    (plain,) = h.enqueue("plain", [{"plan": {"plain": {"op": "raise", "message": "no"}}}])
    h.wait_all(timeout=60)
    row = h.row(once)
    assert (row["status"], row["retries"]) == ("done", 1), row
    assert row["state"]["retry_error"] == "1 ValueError: flaky"
    row = h.row(always)
    assert (row["status"], row["retries"]) == ("failed", 2), row
    assert row["state"]["dispatch_error"] == "1 ValueError: broken"
    row = h.row(plain)
    assert (row["status"], row["retries"]) == ("failed", 0), "no RETRY_DELAY: as today"
    assert row["state"]["error"] == "ValueError: no"

    def counts() -> tuple:
        a = h.stage_stats().get("a", {})
        return (a.get("processed"), a.get("failed"))

    wait_until(lambda: counts() == (1, 1), 15, message=lambda: f"stage_stats a: {counts()}")
    assert d.terminate() == 0
