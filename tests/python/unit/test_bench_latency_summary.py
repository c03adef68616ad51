"""Unit test of the bench's latency summary (devtools/bench/core.py): no database."""

from __future__ import annotations

from pepsi_dispatch.devtools.bench.core import summarize_latency


def test_from_the_commit_returned_is_taken_per_sample_not_from_two_medians() -> None:
    """Each sample's own enqueue round trip is taken off it: the difference of
    the two medians would pair a fast enqueue with a slow start."""
    samples = [0.010, 0.003, 0.004]  # enqueue call -> handler start
    enqueues = [0.008, 0.001, 0.001]  # that call's round trip
    r = summarize_latency(samples, enqueues, cold=0.2)
    assert r["after_commit_p50"] == 0.002 and r["after_commit_p99"] == 0.003
    assert r["p50"] - r["enqueue_p50"] == 0.003  # what the medians would have said
    assert r["n"] == 3 and r["cold"] == 0.2 and r["max"] == 0.010
