"""The endurance run's descriptor check: a leak raises the floor; a worker being
replaced (its pipes beside its successor's) is a peak, not a leak."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "endurance"))

from run import fds_flat  # noqa: E402


def test_peaks_of_workers_being_replaced_are_no_leak() -> None:
    # The 2-hour run on 4c6d69d: 60 almost always, 64-72 for a sample now and then.
    vals = [60] * 30 + [64, 60, 72, 60, 68] + [60] * 30 + [72, 64] + [60] * 20
    ok, text = fds_flat(vals)
    assert ok, text


def test_a_slow_leak_is_seen() -> None:
    vals = [60 + n // 10 for n in range(106)]  # one more descriptor every 10 samples
    ok, text = fds_flat(vals)
    assert not ok, text


def test_a_leak_hidden_under_peaks_is_seen() -> None:
    vals = [60, 64] * 20 + [64, 68] * 20
    assert not fds_flat(vals)[0]
