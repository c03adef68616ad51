"""``bench --costs`` on the throughput run (devtools/bench/recycling.py): recycles
are counted in the dispatcher's log, backends in the stage program's events up
to the drain's end, and a drain is set against its base (no recycle)."""

from __future__ import annotations

import math

import pytest

from pepsi_dispatch.devtools.bench.core import SDK_WORKER
from pepsi_dispatch.devtools.bench.recycling import (
    EVENTS_HOOK,
    Drain,
    Events,
    count_recycles,
    per_recycle,
    read_events,
    steady_pass_on,
    summary_line,
)

LOG = """\
05:00:01 INFO stage bench_s1 worker pid 101 stopped (MAX_MESSAGES (1000) reached): exited 0
05:00:02 INFO stage bench_s1 worker pid 102 stopped (template probe, handed nothing): exited 0
05:00:03 INFO stage bench_s2 worker pid 103 stopped (MAX_MESSAGES (1000) reached): exited 0
05:00:04 INFO stage bench_s2 worker pid 104 stopped (dispatcher stopping): exited 0
"""


def test_recycles_are_the_workers_stopped_at_max_messages() -> None:
    assert count_recycles(LOG) == 2


def test_events_after_the_drain_are_not_counted() -> None:
    text = (
        "100.0 7 connect\n"
        "100.5 9 unlent\n"
        "101.0 9 lent\n"
        "101.2 11 start 0.012500 501 0.004000\n"  # a new backend: all its CPU
        "101.3 11 giveback 0.200000 501 0.150000\n"
        "101.31 11 exit 0.201500\n"
        "101.4 12 start 0.007500 501 0.150500 1\n"  # passed on: since the giveback
        "101.45 14 start 0.400000 502 0.003000 0\n"  # exec'd: its interpreter's start
        "102.0 9 lent\n"  # the shutdown's
        "102.1 13 connect\n"
    )
    e = read_events(text, until=101.5)
    assert (e.connects, e.lent, e.unlent, e.forks) == (1, 1, 1, 2)
    assert e.started == 2 and e.startup_cpu == pytest.approx(0.02) and e.workers == 3
    assert e.ended == 1 and e.end_cpu == pytest.approx(0.0015)
    assert e.backend_cpu == pytest.approx(0.004 + 0.0005 + 0.003)
    assert e.templates == {9}


def _drain(recycles: int, connects: int, lent: int, unlent: int, **cpu: float) -> Drain:
    return Drain(
        recycles=recycles,
        events=Events(
            connects=connects,
            lent=lent,
            unlent=unlent,
            started=lent + unlent,
            workers=lent + unlent,
            startup_cpu=cpu.pop("startup", 0.0),
        ),
        **{"service_cpu": 0.0, "dispatcher_cpu": 0.0, "pg_cpu": 0.0, **cpu},
    )


def test_a_drain_against_its_base() -> None:
    # 20 recycles; 5 backends more than the base (probe + first burst in both):
    # 15 of 20 recycles started no backend.
    base = _drain(0, 5, 0, 4, service_cpu=10.0, dispatcher_cpu=2.0, pg_cpu=9.0, startup=0.04)
    run = _drain(
        20,
        10,
        17,
        7,
        service_cpu=10.3,
        dispatcher_cpu=2.02,
        pg_cpu=9.1,
        startup=0.24,
        template_cpu=0.1,
    )
    p = per_recycle(run, base)
    assert p["recycles"] == 20
    assert p["backends"] == pytest.approx(0.25)
    assert p["pass_on"] == pytest.approx(0.75)
    # the base's 4 first workers connected themselves: their 4 recycles are not
    # counted, nor the 4 backends they cost; 15 of the other 16 passed theirs on
    assert p["pass_on_later"] == pytest.approx(1 - 1 / 16)
    assert p["lent"] == pytest.approx(17 / 24)
    assert p["cpu_ms"] == pytest.approx(20.0)  # (10.3 + 9.1 - 19.0) s / 20
    assert p["dispatcher_ms"] == pytest.approx(1.0)
    assert p["workers_ms"] == pytest.approx(14.0)
    assert p["pg_ms"] == pytest.approx(5.0)
    assert p["startup_ms"] == pytest.approx(10.0)  # 0.24 s over 24 forked workers
    assert p["template_ms"] == pytest.approx(5.0)
    assert p["direct_ms"] == pytest.approx(15.0)
    line = summary_line("sdk-default", [p, {**p, "cpu_ms": 30.0}])
    assert "pass-on 75.0%" in line and "drain minus base 25.0 ms (20.0 / 30.0)" in line


def test_no_recycle_gives_no_figure() -> None:
    base = _drain(0, 5, 0, 4)
    p = per_recycle(_drain(0, 5, 0, 4), base)
    assert math.isnan(p["pass_on"]) and math.isnan(p["cpu_ms"])
    assert "no recycle" in summary_line("sdk", [p])


def test_the_sdk_program_with_the_hook_compiles() -> None:
    src = SDK_WORKER.format(python="/usr/bin/python3", group_commit="", events_hook=EVENTS_HOOK)
    compile(src, "noop-sdk-default.py", "exec")


def test_pass_on_once_the_first_generations_ended() -> None:
    # 4 first workers connected themselves (t 0), their ends (t 10-13) each had
    # a session opened (t 10.1-13.1); the next 4 ends (t 20-23) likewise, two of
    # them; then 6 ends (t 30-35) and one connect (t 31.5): 5 of 6 passed on.
    e = Events(
        connect_times=[0.0] * 4 + [10.1, 11.1, 12.1, 13.1, 20.1, 22.1, 31.5],
        exit_times=[10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 32, 33, 34, 35],
    )
    rate, n = steady_pass_on(e, 8)
    assert n == 6 and rate == pytest.approx(5 / 6)
    assert steady_pass_on(e, 14) == (pytest.approx(float("nan"), nan_ok=True), 0)
    rate, n = steady_pass_on(e, 0)  # from the start: every connect counts
    assert n == 14 and rate == pytest.approx(1 - 11 / 14)
