"""MIN_WORKERS with the real dispatcher and real workers: warm workers started
before any message, kept through idle timeouts, topped up when one goes, none
while PAUSED, and a program that cannot stay up is retried at the cooldown's
pace, not in a fork loop.

Worker processes are seen through /proc (the dispatcher's children with
PEPSI_STAGE); POLL_INTERVAL is 60 s, so nothing here is driven by the heartbeat.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

from dispatch_harness import Harness, harness_fixture, pid_alive, wait_until  # noqa: F401


def _stays(predicate, seconds: float, what: str) -> None:
    """Assert ``predicate()`` on every poll for ``seconds`` (a steady state, polled)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert predicate(), what
        time.sleep(0.05)


def test_min_workers_are_started_early_kept_idle_and_topped_up(h: Harness) -> None:
    stages = h.pipeline(["a"], PARALLELISM=3, QUEUE_LIMIT=1, MIN_WORKERS=2)
    d = h.start(h.conf(stages, WORKER_IDLE_TIMEOUT="0.5 s"))

    def warm() -> set[int]:
        return set(d.workers().get("a", []))

    # Two workers are up before any message is enqueued.
    first = wait_until(lambda: len(warm()) == 2 and warm(), 20, message="two warm workers")
    assert h.counts() == {}
    # The same two processes, through several idle timeouts.
    _stays(lambda: warm() == first, 3.0, "the warm workers were stopped or replaced while idle")
    assert "stopped (idle)" not in d.log()

    # A burst that needs a third worker (QUEUE_LIMIT 1, one second each).
    ids = h.enqueue("a", [{"do": "sleep:1;next"} for _ in range(3)])
    wait_until(lambda: len(warm()) == 3, 20, message="a third worker for the burst")
    h.wait_all("done", timeout=60)
    # The warm two took messages of the burst (no fresh start for them).
    ran = {r.pid for r in h.wlog().runs if r.wq_id in ids}
    assert first <= ran, (first, ran)
    # The third goes idle and is stopped; two stay.
    wait_until(lambda: len(warm()) == 2, 20, message="the third worker stopped as idle")
    # (its exit is logged when the dispatcher reaps it, which may be a moment later)
    wait_until(lambda: "stopped (idle)" in d.log(), 10, message=lambda: d.tail())
    kept = warm()
    _stays(lambda: warm() == kept, 2.0, "a warm worker went below MIN_WORKERS")
    assert d.log().count("stopped (idle)") == 1, d.tail()

    # A warm worker killed with SIGKILL is replaced.
    victim = min(kept)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: not pid_alive(victim), 10, message="the killed worker gone")
    replaced = wait_until(
        lambda: len(warm()) == 2 and victim not in warm() and warm(),
        30,
        message=lambda: f"a replacement for pid {victim}: {warm()}\n{d.tail()}",
    )
    assert len(replaced & kept) == 1

    # Everything done exactly once.
    more = h.enqueue("a", [{"do": "sleep:0.05;next"} for _ in range(20)])
    h.wait_all("done", timeout=60)
    runs = Counter(r.wq_id for r in h.wlog().runs)
    assert all(runs[i] == 1 for i in ids + more), runs
    assert h.overlaps() == []

    # While stopping, nothing is started again.
    assert d.terminate() == 0
    log = d.log()
    assert "to keep MIN_WORKERS" not in log[log.index("stopping: no more claims") :]


def test_a_worker_recycled_at_max_messages_leaves_a_warm_one(h: Harness) -> None:
    """MAX_MESSAGES 3: the worker that did them is recycled; one worker (its
    warm spare or a top-up) is up afterwards and stays through idle timeouts."""
    stages = h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=1, MAX_MESSAGES=3, MIN_WORKERS=1)
    d = h.start(h.conf(stages, WORKER_IDLE_TIMEOUT="0.5 s"))

    def warm() -> set[int]:
        return set(d.workers().get("a", []))

    first = wait_until(lambda: len(warm()) == 1 and warm(), 20, message="a warm worker")
    h.enqueue("a", 3)
    h.wait_all("done", timeout=60)
    wait_until(lambda: first.isdisjoint(warm()), 20, message="the recycled worker gone")
    after = wait_until(lambda: len(warm()) == 1 and warm(), 20, message="its warm successor")
    _stays(lambda: warm() == after, 2.0, "the stage fell below MIN_WORKERS after a recycle")
    assert f"worker pid {min(first)} stopped (MAX_MESSAGES (3) reached)" in d.log(), d.tail()
    assert d.terminate() == 0


def test_min_workers_follow_a_reload_and_pause(h: Harness) -> None:
    """Raised by the overlay: started without a message; PAUSED: none kept;
    resumed: started again."""
    stages = h.pipeline(["a"], PARALLELISM=2)
    d = h.start(h.conf(stages, WORKER_IDLE_TIMEOUT="0.5 s"))

    def n_workers() -> int:
        return len(d.workers().get("a", []))

    wait_until(
        lambda: "(template probe, handed nothing): exited" in d.log() and n_workers() == 0,
        20,
        message=lambda: "the template probe's end\n" + d.tail(),
    )
    _stays(lambda: n_workers() == 0, 1.0, "a worker without MIN_WORKERS and without messages")
    h.set_config("stage-a", "MIN_WORKERS", "2")
    wait_until(lambda: n_workers() == 2, 20, message=lambda: "warm workers\n" + d.tail())
    h.set_config("stage-a", "PAUSED", "yes")
    wait_until(lambda: n_workers() == 0, 20, message=lambda: "no warm worker\n" + d.tail())
    _stays(lambda: n_workers() == 0, 1.5, "a paused stage was kept warm")
    h.set_config("stage-a", "PAUSED", "no")
    wait_until(lambda: n_workers() == 2, 20, message=lambda: "warm again\n" + d.tail())
    h.enqueue("a", 5)
    assert h.wait_all("done", timeout=60) == {"done": 5}
    assert d.terminate() == 0


def test_a_program_that_exits_at_once_is_not_fork_looped(h: Harness) -> None:
    """A warm worker that exits before answering cools its stage down (1 s,
    then 2 s, ...): a handful of starts in a few seconds, not hundreds."""
    conf = h.conf({"a": {"PROGRAM": "/bin/true", "MIN_WORKERS": "1"}})
    d = h.start(conf)
    wait_until(lambda: "holding off new workers" in d.log(), 20, message=lambda: d.tail())
    _stays(d.running, 3.5, "the dispatcher stopped")  # how many starts in this window
    starts = d.log().count("to keep MIN_WORKERS")
    assert 2 <= starts <= 5, d.tail()
    assert d.running()
    assert d.terminate() == 0
