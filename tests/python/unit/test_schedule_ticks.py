"""[schedule-NAME]: option checks with FILE:LINE, the tick arithmetic, and which
ticks the running scheduler fires after a gap (a stand-in database, an injected
wall clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fake_store import FakeStore

from pepsi_dispatch.config import ConfigError, ScheduleConfig, load_config
from pepsi_dispatch.config.schedule import (
    MAX_TICKS_PER_CALL,
    latest_tick,
    missed_ticks,
    next_tick,
    ticks_between,
)
from pepsi_dispatch.coordinator.schedules import Scheduler

NOON = datetime(2026, 3, 29, 12, 0, tzinfo=UTC)


def every(seconds: float, catch_up: float = 0.0, ticks: int = 0) -> ScheduleConfig:
    return ScheduleConfig(
        name="e", stage="s", every=seconds, catch_up=catch_up, catch_up_ticks=ticks
    )


def cron(expr: str, tz: str = "UTC", catch_up: float = 0.0) -> ScheduleConfig:
    return ScheduleConfig(name="c", stage="s", cron=expr, timezone=tz, catch_up=catch_up)


def test_every_ticks_on_multiples_since_the_epoch() -> None:
    s = every(3600)
    assert next_tick(s, NOON) == NOON + timedelta(hours=1)
    assert next_tick(s, NOON - timedelta(seconds=1)) == NOON
    assert ticks_between(every(1), NOON, NOON + timedelta(seconds=3)) == [
        NOON + timedelta(seconds=i) for i in (1, 2, 3)
    ]


def test_cron_in_a_time_zone_across_the_spring_forward() -> None:
    """02:30 does not exist in Berlin on 2026-03-29: cron fires once, at the jump (01:00 UTC)."""
    s = cron("30 2 * * *", "Europe/Berlin")
    assert latest_tick(s, NOON) == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    assert next_tick(s, NOON) == datetime(2026, 3, 30, 0, 30, tzinfo=UTC)


def test_catch_up_0_owes_only_the_latest_missed_tick() -> None:
    s = every(60)
    assert missed_ticks(s, NOON - timedelta(minutes=10), NOON) == [NOON]
    assert missed_ticks(s, NOON, NOON + timedelta(seconds=30)) == []
    assert missed_ticks(s, None, NOON) == [], "a schedule never registered owes nothing"


def test_catch_up_owes_the_missed_ticks_that_young() -> None:
    s = every(60, catch_up=180)
    got = missed_ticks(s, NOON - timedelta(minutes=10), NOON)
    assert got == [NOON - timedelta(minutes=m) for m in (3, 2, 1, 0)]
    assert missed_ticks(every(60, 180), NOON - timedelta(minutes=2), NOON) == [
        NOON - timedelta(minutes=1),
        NOON,
    ]


def test_catch_up_n_owes_at_most_n_missed_ticks_besides_the_current_one() -> None:
    """CATCH_UP = 3 with EVERY = 1 min, ten minutes down: three missed ticks and the
    current one (a bare number is a count of ticks, not seconds)."""
    got = missed_ticks(every(60, ticks=3), NOON - timedelta(minutes=10), NOON)
    assert got == [NOON - timedelta(minutes=m) for m in (3, 2, 1, 0)]
    # Fewer missed than allowed: all of them.
    got = missed_ticks(every(60, ticks=3), NOON - timedelta(minutes=2), NOON)
    assert got == [NOON - timedelta(minutes=1), NOON]
    assert missed_ticks(every(60, ticks=3), NOON, NOON + timedelta(seconds=30)) == []


def test_catch_up_n_of_a_cron_schedule_across_days() -> None:
    s = ScheduleConfig(name="c", stage="s", cron="30 2 * * *", catch_up_ticks=2)
    now = datetime(2026, 3, 10, 9, 0, tzinfo=UTC)
    got = missed_ticks(s, now - timedelta(days=30), now)
    assert got == [datetime(2026, 3, d, 2, 30, tzinfo=UTC) for d in (8, 9, 10)]


def test_a_huge_catch_up_n_is_worked_off_in_calls_of_max_ticks() -> None:
    s = every(1, ticks=MAX_TICKS_PER_CALL * 3)
    got = missed_ticks(s, NOON - timedelta(hours=1), NOON)
    assert len(got) == MAX_TICKS_PER_CALL
    assert got[0] == NOON - timedelta(seconds=MAX_TICKS_PER_CALL * 3)


# CATCH_UP 5 s at 12:00:31.2: the ticks of 12:00:27 to :31, none older than 5 s.
# CATCH_UP = 4 (ticks): the four youngest missed ticks and the current one.
@pytest.mark.parametrize(
    ("catch_up", "ticks", "fired"), [(0, 0, 1), (5, 0, 5), (0, 4, 5), (0, 1, 2)]
)
def test_catch_up_bounds_a_gap_while_the_dispatcher_runs(
    catch_up: float, ticks: int, fired: int
) -> None:
    """A running dispatcher frozen for 30 s (SIGSTOP, a suspended host, a clock
    step) fires at most CATCH_UP's worth of the missed ticks, besides the
    current one -- as after a stop -- not all 30 of them at once."""
    clock = [NOON + timedelta(milliseconds=500)]
    work = FakeStore()
    work.settled = NOON  # the registry says so; every tick fired is enqueued
    sched = Scheduler({"e": every(1, catch_up, ticks)}, work, wall=lambda: clock[0])
    assert sched.fire_due(0.0) == 0  # registered; nothing missed yet
    clock[0] = NOON + timedelta(seconds=1, milliseconds=100)
    assert sched.fire_due(1.0) == 1 and work.fired[-1].ticks == [NOON + timedelta(seconds=1)]
    clock[0] = NOON + timedelta(seconds=31, milliseconds=200)  # thawed
    assert sched.fire_due(31.0) == fired
    assert work.fired[-1].ticks == [
        NOON + timedelta(seconds=31 - k) for k in reversed(range(fired))
    ]
    clock[0] = NOON + timedelta(seconds=32, milliseconds=50)
    assert sched.fire_due(32.0) == 1, "then every tick again"


def write(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "pepsi.conf"
    p.write_text("[stage-s]\nPROGRAM = /bin/true\n\n[schedule-x]\nSTAGE = s\n" + body)
    return p


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("CRON = 61 * * * *", "not a cron expression"),
        ("CRON = * * * *", "has 5 fields"),
        ("EVERY = 500 ms", "at least 1 s"),
        ("EVERY = 1 s\nTIMEZONE = Mars/Base", "unknown time zone"),
        ("EVERY = 1 s\nPAYLOAD = [1]", "must be a JSON object"),
        ("EVERY = 1 s\nPRIORITY = high", "not an integer"),
        ("EVERY = 1 s\nSTAGES = s", "unknown option"),
        ("EVERY = 1 s\nCATCH_UP = 1.5", "a whole number"),
        ("EVERY = 1 s\nCATCH_UP = -1", "a number of missed ticks"),
        ("EVERY = 1 s\nCATCH_UP = 100001", "at most 100000 missed ticks"),
        ("EVERY = 1 s\nCATCH_UP = soon", "a number of missed ticks"),
    ],
)
def test_a_bad_schedule_names_file_and_line(tmp_path: Path, line: str, says: str) -> None:
    conf = write(tmp_path, line + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(conf)
    bad = line.splitlines()[-1]
    n = conf.read_text().splitlines().index(bad) + 1
    assert str(err.value).startswith(f"{conf}:{n}: [schedule-x]") and says in str(err.value)


def test_exactly_one_of_cron_and_every_and_a_defined_stage(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="exactly one of CRON"):
        load_config(write(tmp_path, "CRON = * * * * *\nEVERY = 1 s\n"))
    with pytest.raises(ConfigError, match="exactly one of CRON"):
        load_config(write(tmp_path, "PRIORITY = 1\n"))
    p = tmp_path / "other.conf"
    p.write_text("[stage-s]\nPROGRAM = /bin/true\n[schedule-y]\nSTAGE = t\nEVERY = 1 s\n")
    with pytest.raises(ConfigError, match="STAGE names undefined stage 't'"):
        load_config(p)


def test_a_good_schedule_loads(tmp_path: Path) -> None:
    c = load_config(write(tmp_path, 'EVERY = 30 s\nPAYLOAD = {"k": 1}\nCATCH_UP = 1 h\n'))
    s = c.schedules["x"]
    assert (s.every, s.catch_up, s.payload_object(), s.spec()) == (
        30.0,
        3600.0,
        {"k": 1},
        "EVERY 30 s",
    )


@pytest.mark.parametrize(
    ("value", "ticks", "seconds"),
    [("3", 3, 0.0), ("0", 0, 0.0), ("6 h", 0, 21600.0), ("90s", 0, 90.0), ("0 s", 0, 0.0)],
)
def test_catch_up_is_a_count_of_ticks_or_a_duration_with_its_unit(
    tmp_path: Path, value: str, ticks: int, seconds: float
) -> None:
    s = load_config(write(tmp_path, f"EVERY = 1 min\nCATCH_UP = {value}\n")).schedules["x"]
    assert (s.catch_up_ticks, s.catch_up) == (ticks, seconds)
