"""``[schedule-NAME]`` sections: their options, and the ticks they fire.

A schedule enqueues one message at STAGE on every tick::

    [schedule-nightly-report]
    STAGE = report
    PAYLOAD = {"kind": "nightly"}
    CRON = 30 2 * * *            # standard 5 fields: minute hour day month weekday
    TIMEZONE = Europe/Berlin     # of CRON (default UTC)
    CATCH_UP = 6 h               # after downtime, missed ticks this far back (or N: that many)
    PRIORITY = 5
    DEDUPE_KEY = nightly-report  # no new tick while the last one's message is live

or ``EVERY = 30 s`` instead of CRON: ticks on the multiples of that duration
since 1970-01-01 00:00 UTC, so every replica computes the same ticks.

Ticks are wall-clock times. Cron expressions are parsed and evaluated by
cronsim (a maintained, dependency-free library also used by healthchecks.io),
not by our own parser: its daylight-saving rules (a time that does not exist
fires once, at the jump; a repeated hour fires once) are cron's.

Which ticks a dispatcher enqueues (``missed_ticks``): whenever a tick is due,
the latest tick and, of the ticks missed since the last one settled (the
database records what is settled), at most CATCH_UP: ``CATCH_UP = N`` (a bare
number) the N youngest missed ticks, ``CATCH_UP = 6 h`` (a duration, with its
unit) those not older than that. CATCH_UP 0, the default: the current tick,
once. The same bound holds for every gap, whatever caused it: a stop, a
reload, a reconnect, a frozen process, a suspended host, a clock step. A
dispatcher that keeps up fires each tick as it comes, which is the latest one
then.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from pepsi_dispatch.config.ini import BadValue as _Bad
from pepsi_dispatch.config.values import _time_value

__all__ = [
    "MAX_CATCH_UP_TICKS",
    "MAX_TICKS_PER_CALL",
    "CatchUp",
    "latest_tick",
    "ScheduleConfig",
    "missed_ticks",
    "next_tick",
    "ticks_between",
    "youngest_ticks",
]

#: At most this many ticks are enqueued by one call (a long CATCH_UP of a
#: frequent schedule is worked off over several wakes).
MAX_TICKS_PER_CALL = 1000
#: The largest ``CATCH_UP = N`` (a count of missed ticks).
MAX_CATCH_UP_TICKS = 100_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_WHOLE_NUMBER = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class ScheduleConfig:
    """One ``[schedule-NAME]`` section."""

    name: str
    stage: str
    payload: str = "{}"  # a JSON object, as text (compact)
    cron: str | None = None  # 5 fields
    every: float | None = None  # seconds, >= 1
    timezone: str = "UTC"
    catch_up: float = 0.0  # seconds: CATCH_UP given as a duration
    catch_up_ticks: int = 0  # CATCH_UP given as a bare number: missed ticks
    priority: int = 0
    dedupe_key: str | None = None

    def spec(self) -> str:
        """The schedule for people: ``CRON 30 2 * * * (Europe/Berlin)`` or ``EVERY 30 s``."""
        if self.cron is not None:
            return f"CRON {self.cron} ({self.timezone})"
        return f"EVERY {self.every:g} s"

    def payload_object(self) -> dict[str, Any]:
        """PAYLOAD as a dict."""
        doc = json.loads(self.payload)
        assert isinstance(doc, dict)
        return doc


# -- option converters (BadValue: the loader adds FILE:LINE) ---------------------------


def cron_opt(text: str) -> str:
    """CRON: exactly 5 fields that cronsim accepts."""
    fields = text.split()
    if len(fields) != 5:
        raise _Bad(
            f"a cron expression has 5 fields (minute hour day month weekday), not"
            f" {len(fields)}; e.g. '*/5 * * * *'"
        )
    expr = " ".join(fields)
    try:
        CronSim(expr, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise _Bad(f"not a cron expression: {exc}; e.g. '30 2 * * *'") from None
    return expr


def every_opt(text: str) -> float:
    """EVERY: a duration of at least 1 s."""
    t = _time_value(text)
    if t < 1:
        raise _Bad("must be at least 1 s; use e.g. '30 s' or '1 h'")
    return t


def timezone_opt(text: str) -> str:
    """TIMEZONE: an IANA zone name."""
    name = text.strip() or "UTC"
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise _Bad("unknown time zone; use an IANA name such as UTC or Europe/Berlin") from None
    return name


def payload_opt(text: str) -> str:
    """PAYLOAD: a JSON object, kept as compact text."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Bad(f"not JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(doc, dict):
        raise _Bad('must be a JSON object, e.g. {"kind": "nightly"}')
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def priority_opt(text: str) -> int:
    """PRIORITY: any int4 (negative allowed)."""
    try:
        n = int(text.strip())
    except ValueError:
        raise _Bad("not an integer; e.g. 5 or -1") from None
    if not -(2**31) <= n < 2**31:
        raise _Bad("out of range (-2147483648 ... 2147483647)")
    return n


def dedupe_key_opt(text: str) -> str | None:
    """DEDUPE_KEY: 1 to 512 bytes (empty: none)."""
    key = text.strip()
    if len(key.encode()) > 512:
        raise _Bad("too long; at most 512 bytes")
    return key or None


@dataclass(frozen=True)
class CatchUp:
    """CATCH_UP as written: a number of missed ticks, or a duration (seconds)."""

    ticks: int = 0
    seconds: float = 0.0


def catch_up_opt(text: str) -> CatchUp:
    """CATCH_UP: ``N`` (at most N missed ticks besides the current one) or a
    duration with its unit (the missed ticks not older than that)."""
    s = text.strip()
    if _WHOLE_NUMBER.fullmatch(s):
        n = int(s)
        if n > MAX_CATCH_UP_TICKS:
            raise _Bad(
                f"at most {MAX_CATCH_UP_TICKS} missed ticks; for a time span give a unit,"
                " e.g. '6 h'"
            )
        return CatchUp(ticks=n)
    try:
        seconds = _time_value(s)
    except _Bad:
        raise _Bad(
            "a number of missed ticks (e.g. 3) or a duration with its unit (e.g. '6 h')"
        ) from None
    if not any(c.isalpha() for c in s):
        raise _Bad(
            "a number of missed ticks is a whole number (e.g. 3); for a time span give a"
            " unit, e.g. '90 s'"
        )
    if seconds < 0:
        raise _Bad("must be 0 or more")
    return CatchUp(seconds=seconds)


# -- ticks ---------------------------------------------------------------------------


def _aware(t: datetime) -> datetime:
    if t.tzinfo is None:
        raise ValueError("tick times are timezone-aware")
    return t


def next_tick(s: ScheduleConfig, after: datetime) -> datetime:
    """The first tick strictly after ``after`` (UTC)."""
    after = _aware(after)
    if s.every is not None:
        k = math.floor((after - _EPOCH).total_seconds() / s.every) + 1
        tick = _EPOCH + timedelta(seconds=k * s.every)
        while tick <= after:  # float rounding
            k += 1
            tick = _EPOCH + timedelta(seconds=k * s.every)
        return tick
    assert s.cron is not None
    local = after.astimezone(ZoneInfo(s.timezone))
    it = CronSim(s.cron, local.replace(microsecond=0))
    while True:
        tick = next(it).astimezone(UTC)
        if tick > after:
            return tick


def ticks_between(s: ScheduleConfig, start: datetime, end: datetime) -> list[datetime]:
    """Ticks t with start < t <= end, oldest first, at most MAX_TICKS_PER_CALL (the oldest)."""
    out: list[datetime] = []
    t = next_tick(s, start)
    while t <= end and len(out) < MAX_TICKS_PER_CALL:
        out.append(t)
        t = next_tick(s, t)
    return out


def latest_tick(s: ScheduleConfig, at_or_before: datetime) -> datetime | None:
    """The last tick at or before ``at_or_before`` (None: none in the last 400 days)."""
    end = _aware(at_or_before)
    if s.every is not None:
        k = math.floor((end - _EPOCH).total_seconds() / s.every)
        return _EPOCH + timedelta(seconds=k * s.every)
    assert s.cron is not None
    local = end.astimezone(ZoneInfo(s.timezone))
    # Reverse iteration yields ticks at or before the start (whole seconds).
    for tick in CronSim(s.cron, local.replace(microsecond=0), reverse=True):
        tick = tick.astimezone(UTC)
        if tick <= end:
            return tick if end - tick <= timedelta(days=400) else None
    return None


def youngest_ticks(s: ScheduleConfig, after: datetime, now: datetime, n: int) -> list[datetime]:
    """The youngest ``n`` ticks t with after < t <= now, oldest first."""
    out: list[datetime] = []
    if s.every is not None:
        latest = latest_tick(s, now)
        k = round((latest - _EPOCH).total_seconds() / s.every) if latest else 0
        while latest is not None and len(out) < n:
            tick = _EPOCH + timedelta(seconds=(k - len(out)) * s.every)
            if tick <= after:
                break
            out.append(tick)
        return out[::-1]
    assert s.cron is not None
    local = _aware(now).astimezone(ZoneInfo(s.timezone))
    for tick in CronSim(s.cron, local.replace(microsecond=0), reverse=True):
        tick = tick.astimezone(UTC)
        if tick > now:
            continue
        if tick <= after or len(out) >= n:
            break
        out.append(tick)
    return out[::-1]


def missed_ticks(s: ScheduleConfig, settled: datetime | None, now: datetime) -> list[datetime]:
    """The ticks to enqueue at ``now``: after ``settled`` (the last tick settled;
    None: a schedule never registered, which owes nothing), the latest one and,
    of the missed ones, at most CATCH_UP: the youngest ``catch_up_ticks``, or
    those not older than ``catch_up`` seconds. However long the gap since
    ``settled``, that is at most CATCH_UP's worth of missed ticks besides the
    current one (the oldest MAX_TICKS_PER_CALL of them per call)."""
    if settled is None:
        return []
    latest = latest_tick(s, now)
    if latest is None or latest <= settled:
        return []
    if s.catch_up_ticks:
        return youngest_ticks(s, settled, now, s.catch_up_ticks + 1)[:MAX_TICKS_PER_CALL]
    window_start = max(settled, now - timedelta(seconds=s.catch_up))
    young = ticks_between(s, window_start - timedelta(microseconds=1), now)
    young = [t for t in young if t > settled and t >= now - timedelta(seconds=s.catch_up)]
    return young or [latest]
