"""In-memory statistics deltas, flushed through ``pepsi.flush_stats``.

The dispatcher is the only writer of ``pepsi.stage_stats`` and
``pepsi.dispatch_stats``. Counting happens here, in memory, on the hot path
(a few integer additions per answer); the database sees one
``pepsi.flush_stats`` call per flush carrying every delta at once. A flush
that fails keeps its deltas, so they go out with the next one.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

#: Bucket upper bounds (seconds) of the dispatcher's histograms: database round
#: trips (sub-millisecond upwards) and per-stage service times (up to minutes).
DB_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
SERVICE_BUCKETS: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)


@dataclass(slots=True)
class Histogram:
    """Cumulative-since-start bucket counters (Prometheus histogram semantics).

    ``counts[i]`` counts observations in (bounds[i-1], bounds[i]]; the last
    slot is +Inf. Never reset: exported through the heartbeat's gauges.
    """

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_zeros(self, n: int) -> None:
        """``n`` observations of 0 s (answers read in the same batch as the one before)."""
        self.counts[bisect_left(self.bounds, 0.0)] += n

    def as_dict(self) -> dict[str, Any]:
        return {"bounds": list(self.bounds), "counts": list(self.counts), "sum": self.sum}


@dataclass(slots=True)
class StageCounters:
    """Deltas of one stage since the last successful flush."""

    processed: int = 0
    failed: int = 0
    timeouts: int = 0
    crashes: int = 0
    seconds: float = 0.0

    def empty(self) -> bool:
        """True when there is nothing to write for this stage."""
        return not (self.processed or self.failed or self.timeouts or self.crashes or self.seconds)


@dataclass(slots=True)
class Stats:
    """All deltas since the last successful flush, plus running totals for logs."""

    stages: dict[str, StageCounters] = field(default_factory=dict)
    stage_runs: int = 0
    messages: int = 0
    requeued: int = 0
    expired: int = 0
    #: Totals since start (never reset), for the shutdown summary line.
    total_messages: int = 0
    total_stage_runs: int = 0
    #: Since start, for the heartbeat's gauges (pepsi-httpd's /metrics).
    claims: int = 0
    db_seconds: Histogram = field(default_factory=lambda: Histogram(DB_BUCKETS))
    service: dict[str, Histogram] = field(default_factory=dict)

    def served(self, stage: str, seconds: float) -> None:
        """One message's service time at ``stage`` (answer time − hand-out time)."""
        h = self.service.get(stage)
        if h is None:
            h = self.service[stage] = Histogram(SERVICE_BUCKETS)
        h.observe(seconds)

    def round_trip(self, seconds: float, claimed: bool) -> None:
        """One hot-path pipeline took ``seconds``; ``claimed``: it carried a claim."""
        self.db_seconds.observe(seconds)
        if claimed:
            self.claims += 1

    def stage(self, name: str) -> StageCounters:
        """Counters of stage ``name`` (created on first use)."""
        counters = self.stages.get(name)
        if counters is None:
            counters = self.stages[name] = StageCounters()
        return counters

    def handed_out(self, n: int) -> None:
        """``n`` ids were written to workers."""
        self.messages += n
        self.total_messages += n

    def succeeded(self, stage: str, seconds: float, fused: tuple[str, ...] = ()) -> None:
        """A ``0`` answer: one stage run, plus one per fused successor stage."""
        counters = self.stage(stage)
        counters.processed += 1
        counters.seconds += seconds
        self.served(stage, seconds)
        for name in fused:
            self.stage(name).processed += 1
        runs = 1 + len(fused)
        self.stage_runs += runs
        self.total_stage_runs += runs

    def succeeded_many(self, stage: str, first: float, n: int) -> None:
        """``n`` answers ``0`` read together: the first took ``first`` seconds, the
        rest 0 s (each one's time counts from the answer before it); the same
        counts as ``n`` calls of :meth:`succeeded`."""
        counters = self.stage(stage)
        counters.processed += n
        counters.seconds += first
        self.served(stage, first)
        if n > 1:
            self.service[stage].observe_zeros(n - 1)
        self.stage_runs += n
        self.total_stage_runs += n

    def failed(self, stage: str, seconds: float) -> None:
        """A non-zero answer or a protocol error: the stage ran and the message failed."""
        counters = self.stage(stage)
        counters.failed += 1
        counters.seconds += seconds
        self.served(stage, seconds)
        self.stage_runs += 1
        self.total_stage_runs += 1

    def left_running(self, stage: str) -> None:
        """``pepsi.check_answered`` failed a row its stage answered ``0`` for but left
        running: that ``0``, counted in ``processed`` when it was read, was a
        failure. It stays a stage run with its processing seconds."""
        counters = self.stage(stage)
        counters.processed -= 1
        counters.failed += 1

    def exhausted(self, stage: str, n: int) -> None:
        """``pepsi.requeue_due`` failed ``n`` paused rows of ``stage``: retries exhausted.

        No stage run (the stage did not run them again), only failures.
        """
        if n:
            self.stage(stage).failed += n

    def retried(self, stage: str, status: str, reason: str) -> None:
        """record_dispatch_error paused a failure for an automatic retry (RETRY_DELAY).

        A retried failure is not a failure: a non-zero answer or a protocol
        error, counted in ``failed`` when it was read, is taken out again (it
        stays a stage run with its processing seconds).  A timeout or a crash
        stays counted in ``timeouts`` / ``crashes``: those count what happened
        to the worker, whatever becomes of the message.  When the retry is due,
        requeue_due's flip counts in ``requeued``; if the retries run out, the
        last failure counts in ``failed`` as without retries.
        """
        if status == "failed" and _is_answer(reason):
            self.stage(stage).failed -= 1

    def timed_out(self, stage: str, seconds: float) -> None:
        """The MAX_RUNTIME watchdog killed a worker over its head-of-line message."""
        counters = self.stage(stage)
        counters.timeouts += 1
        counters.seconds += seconds

    def crashed(self, stage: str, seconds: float) -> None:
        """A worker died with a message at the head of its pipeline."""
        counters = self.stage(stage)
        counters.crashes += 1
        counters.seconds += seconds

    def pending(self) -> bool:
        """True when a flush would write something."""
        if self.stage_runs or self.messages or self.requeued or self.expired:
            return True
        return any(not c.empty() for c in self.stages.values())

    def flush_args(self) -> dict[str, Any]:
        """Arguments of ``pepsi.flush_stats`` for the current deltas."""
        names = [n for n, c in self.stages.items() if not c.empty()]
        cs = [self.stages[n] for n in names]
        return {
            "stages": names,
            "processed": [c.processed for c in cs],
            "failed": [c.failed for c in cs],
            "timeouts": [c.timeouts for c in cs],
            "crashes": [c.crashes for c in cs],
            "seconds": [c.seconds for c in cs],
            "stage_runs": self.stage_runs,
            "messages": self.messages,
            "requeued": self.requeued,
            "expired": self.expired,
        }

    def unflushed(self) -> dict[str, Any]:
        """The deltas not yet flushed, for the heartbeat's gauges: readers add them to
        ``pepsi.stage_stats`` and ``pepsi.dispatch_stats`` so that rates follow what
        is done within a second or two, not the STATS_INTERVAL flush. A flush
        writes the statistics and gauges without them in one statement."""
        stages = {
            name: {
                "processed": c.processed,
                "failed": c.failed,
                "timeouts": c.timeouts,
                "crashes": c.crashes,
                "seconds": c.seconds,
            }
            for name, c in self.stages.items()
            if not c.empty()
        }
        dispatch = {
            "stage_runs": self.stage_runs,
            "messages": self.messages,
            "requeued": self.requeued,
            "expired": self.expired,
        }
        return {"stages": stages, "dispatch": dispatch}

    def unflushed_key(self) -> tuple[Any, ...]:
        """Changes whenever :meth:`unflushed` does (an early-gauges signature part)."""
        return (
            self.stage_runs,
            self.messages,
            self.requeued,
            self.expired,
            *((n, c.processed, c.failed, c.timeouts, c.crashes) for n, c in self.stages.items()),
        )

    def clear(self) -> None:
        """Forget the deltas (after a successful flush of :meth:`flush_args`)."""
        self.stages.clear()
        self.stage_runs = self.messages = self.requeued = self.expired = 0


def _is_answer(reason: str) -> bool:
    """Was this 'failed' reason a worker's answer (counted in ``failed`` when read)?

    The dispatcher writes a non-zero answer as its line (``N reason``) and a
    protocol error as ``protocol error: ...``; a crash's head-of-line message
    gets ``worker exited with code N`` / ``worker killed by signal S`` and is
    counted as a crash instead.
    """
    if reason.startswith("protocol error"):
        return True
    head = reason.split(" ", 1)[0]
    try:
        int(head)
    except ValueError:
        return False
    return True
