"""The dashboard's chart history: one compact sample per snapshot, kept for an hour.

The ring is bounded by time, not by count: it keeps RING_SECONDS of samples (the
dashboard's longest window), whatever the scrape rate, and never more than
RING_MAX samples (a snapshot is taken at most once a second). A sample is
stored compactly (slots, the histogram's counts in an ``array``, its bounds
shared between samples) so an hour of samples at one a second costs about
3 MB, and the process's memory stops growing once the hour is full.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass
from typing import Any

#: Seconds of history kept: the dashboard's longest window (1 h).
RING_SECONDS = 3600.0
#: Samples kept at most (one a second for RING_SECONDS; a snapshot is cached 1 s).
RING_MAX = 3600

_FAILED_STATUSES = ("failed", "timeout", "expired")


@dataclass(slots=True, frozen=True)
class StageSample:
    """One stage's counters at one snapshot, and its live dispatchers' service histogram."""

    stage: str
    processed: int
    failures: int
    bounds: tuple[float, ...] | None = None
    counts: array | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"processed": self.processed, "failures": self.failures}
        if self.bounds is not None and self.counts is not None:
            out["service"] = {"bounds": list(self.bounds), "counts": self.counts.tolist()}
        return out


@dataclass(slots=True, frozen=True)
class Sample:
    """Totals of one snapshot, as the dashboard's charts read them."""

    t: float
    processed: int
    failed: int
    failed_rows: int
    done: int
    pending: int
    running: int
    stages: tuple[StageSample, ...]

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape ``/api/overview`` serves (``samples[]``)."""
        return {
            "t": self.t,
            "processed": self.processed,
            "failed": self.failed,
            "failed_rows": self.failed_rows,
            "done": self.done,
            "pending": self.pending,
            "running": self.running,
            "stages": {s.stage: s.as_dict() for s in self.stages},
        }


def _sum_histograms(hists: list[dict[str, Any]]) -> tuple[list[float], list[int]] | None:
    """One histogram of several with the same bounds (dispatchers' service times)."""
    out: tuple[list[float], list[int]] | None = None
    for h in hists:
        bounds, counts = h.get("bounds") or [], h.get("counts") or []
        if len(counts) != len(bounds) + 1:
            continue
        if out is None:
            out = (list(bounds), list(counts))
        elif out[0] == list(bounds):
            out = (out[0], [a + b for a, b in zip(out[1], counts, strict=True)])
    return out


class SampleRing:
    """Samples of the last RING_SECONDS, oldest first; appended by one thread at a time
    (the snapshot lock), read by any."""

    def __init__(self, seconds: float = RING_SECONDS, most: int = RING_MAX) -> None:
        self.seconds = seconds
        self._samples: deque[Sample] = deque(maxlen=most)
        # One tuple per distinct bounds list, shared by every sample that has it.
        self._bounds: dict[tuple[float, ...], tuple[float, ...]] = {}

    def __len__(self) -> int:
        return len(self._samples)

    def _shared(self, bounds: list[float]) -> tuple[float, ...]:
        key = tuple(bounds)
        return self._bounds.setdefault(key, key)

    def stage_samples(self, data: dict[str, Any]) -> tuple[StageSample, ...]:
        """Per stage: processed, failures counted, and the live dispatchers' service histogram."""
        counters: dict[str, tuple[int, int]] = {}
        for s in data.get("stage_stats") or []:
            counters[s["stage"]] = (s["processed"], s["failed"] + s["timeouts"] + s["crashes"])
        hists: dict[str, list[dict[str, Any]]] = {}
        for d in data.get("dispatchers") or []:
            if not d.get("live"):
                continue
            for stage, h in ((d.get("gauges") or {}).get("service_seconds") or {}).items():
                hists.setdefault(stage, []).append(h)
        out = []
        for stage in {**counters, **hists}:
            processed, failures = counters.get(stage, (0, 0))
            summed = _sum_histograms(hists.get(stage, []))
            if summed is None:
                out.append(StageSample(stage, processed, failures))
            else:
                bounds, counts = summed
                out.append(
                    StageSample(
                        stage, processed, failures, self._shared(bounds), array("q", counts)
                    )
                )
        return tuple(out)

    def add(self, data: dict[str, Any]) -> None:
        """Record one snapshot (``pepsi.dashboard_snapshot()``) and drop what is too old."""
        stats = data.get("stage_stats") or []
        by_status: dict[str, int] = {}
        for q in data.get("queue") or []:
            by_status[q["status"]] = by_status.get(q["status"], 0) + q["count"]
        t = float(data.get("now") or 0.0)
        self._samples.append(
            Sample(
                t=t,
                processed=sum(s["processed"] for s in stats),
                failed=sum(s["failed"] + s["timeouts"] + s["crashes"] for s in stats),
                failed_rows=sum(by_status.get(s, 0) for s in _FAILED_STATUSES),
                done=by_status.get("done", 0),
                pending=by_status.get("pending", 0),
                running=by_status.get("running", 0),
                stages=self.stage_samples(data),
            )
        )
        while self._samples and self._samples[0].t < t - self.seconds:
            self._samples.popleft()

    def as_list(self) -> list[dict[str, Any]]:
        """Every sample kept, oldest first, in the JSON shape the dashboard reads."""
        return [s.as_dict() for s in list(self._samples)]
