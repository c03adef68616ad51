"""pepsi.conf's value types: durations, booleans, bounded integers, stage lists.

Each converter takes the expanded text of one option and returns its value, or
raises :class:`~pepsi_dispatch.config.ini.BadValue` with what is wrong and how to
fix it; the loader adds FILE:LINE and the option.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

from pepsi_dispatch.config.ini import BadValue as _Bad
from pepsi_dispatch.config.ini import ConfigError
from pepsi_dispatch.contract import STAGE_NAME_RE

_TIME_UNITS: dict[str, float] = {
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hrs": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
    "week": 604800.0,
    "weeks": 604800.0,
}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_BARE_NUMBER_RE = re.compile(_NUMBER)
_TIME_PART_RE = re.compile(rf"\s*({_NUMBER})\s*([A-Za-z]+)\s*")
_TIME_HINT = "use a number with ms, s, min, h or d, e.g. '500 ms', '30 s', '5 min', '2 d'"


#: Longest time value (100 years): longer ones overflowed clocks and datetimes
#: at run time. POLL_INTERVAL: epoll_wait's timeout is int milliseconds (24.8 d).
TIME_MAX: Final = 36500 * 86400.0
POLL_INTERVAL_MAX: Final = 24 * 86400.0


def _time_value(text: str) -> float:
    total = _time_sum(text)
    if total > TIME_MAX:
        raise _Bad("too long; at most 36500 d (100 years)")
    return total


def _time_sum(text: str) -> float:
    s = text.strip()
    if not s:
        raise _Bad(f"empty time value; {_TIME_HINT}")
    if _BARE_NUMBER_RE.fullmatch(s):
        return float(s)
    total = 0.0
    pos = 0
    while pos < len(s):
        m = _TIME_PART_RE.match(s, pos)
        if m is None:
            raise _Bad(f"not a time value; {_TIME_HINT}")
        unit = m.group(2).lower()
        if unit not in _TIME_UNITS:
            raise _Bad(f"unknown time unit '{m.group(2)}'; {_TIME_HINT}")
        total += float(m.group(1)) * _TIME_UNITS[unit]
        pos = m.end()
    return total


def parse_time(text: str) -> float:
    """Parse a time value into seconds.

    Accepts ``500 ms``, ``30 s``, ``5 min``, ``24 h``, ``2 d`` (also ``us``, ``sec``,
    ``week`` and the spelled-out words), sums such as ``1 min 30 s``, and a bare
    number meaning seconds. Negative values are not times.

    Raises:
        ConfigError: the text is not a time value (the message says why, no location).
    """
    try:
        return _time_value(text)
    except _Bad as exc:
        raise ConfigError(f"'{text}': {exc}") from None


#: Compact units of the command line: ``90s``, ``10m``, ``1h30m``, ``2d``.
#: ``m`` is minutes there (in a configuration file it is not a unit: ``5 min``).
_COMPACT_RE = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def parse_duration(text: str) -> float:
    """Parse a duration given on the command line into seconds.

    Accepts the compact form ``90s``, ``10m``, ``1h30m``, ``2d12h`` (units d, h,
    m, s in that order, each at most once) as well as everything
    :func:`parse_time` accepts (``5 min``, ``30 s``, a bare number of seconds).

    Raises:
        ConfigError: neither form (the message names both).
    """
    m = _COMPACT_RE.fullmatch(text.strip().lower())
    if m is not None and any(m.groups()):
        d, h, mi, s = (int(g or 0) for g in m.groups())
        total = float(d * 86400 + h * 3600 + mi * 60 + s)
        if total > TIME_MAX:
            raise ConfigError(f"'{text}': too long; at most 36500 d (100 years)")
        return total
    try:
        return _time_value(text)
    except _Bad:
        raise ConfigError(
            f"'{text}' is not a duration; use e.g. 90s, 10m, 1h30m, 2d or '5 min'"
        ) from None


_TRUE = frozenset({"yes", "true", "on", "1"})
_FALSE = frozenset({"no", "false", "off", "0"})


def _bool_value(text: str) -> bool:
    s = text.strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise _Bad("not a boolean; use YES or NO")


def parse_bool(text: str) -> bool:
    """Parse YES/NO, TRUE/FALSE, ON/OFF, 1/0 (case-insensitive).

    Raises:
        ConfigError: any other text.
    """
    try:
        return _bool_value(text)
    except _Bad as exc:
        raise ConfigError(f"'{text}': {exc}") from None


#: Largest integer option: they travel to the database as ``int`` (int4).
INT_MAX: Final = 2_147_483_647


def _int_value(text: str, minimum: int) -> int:
    s = text.strip()
    what = "positive" if minimum == 1 else f">= {minimum}"
    if re.fullmatch(r"-[0-9]+", s):
        # a whole number all the same: say what is wrong with it
        raise _Bad(f"must be {what}; use an integer from {minimum} to {INT_MAX}")
    if not re.fullmatch(r"[0-9]+", s):
        raise _Bad(f"not a whole number; use an integer from {minimum} to {INT_MAX}")
    # Checked on the digits first: int() of thousands of digits raises a plain
    # ValueError (Python's int-string limit), which is no configuration error.
    digits = s.lstrip("0") or "0"
    n = int(digits) if len(digits) <= len(str(INT_MAX)) else INT_MAX + 1
    if n < minimum:
        raise _Bad(f"must be {what}; use an integer from {minimum} to {INT_MAX}")
    if n > INT_MAX:
        raise _Bad(f"out of range; use an integer from {minimum} to {INT_MAX}")
    return n


def _time_opt(minimum_zero: bool) -> Callable[[str], float]:
    def conv(text: str) -> float:
        t = _time_value(text)
        if not minimum_zero and t <= 0:
            raise _Bad("must be greater than 0; use e.g. '30 s'")
        return t

    return conv


def _poll_interval_opt(text: str) -> float:
    t = _time_opt(False)(text)
    if t > POLL_INTERVAL_MAX:
        raise _Bad("too long; at most 24 d")
    return t


def _optional_time_opt(text: str) -> float | None:
    # Empty (or 0) means unset: RETRY_DELAY off, RETRY_DELAY_MAX no cap.
    if not text.strip():
        return None
    return _time_value(text) or None


def _int_opt(minimum: int) -> Callable[[str], int]:
    return lambda text: _int_value(text, minimum)


def _str_opt(text: str) -> str:
    if not text.strip():
        raise _Bad("must not be empty; set a value or remove the line")
    return text.strip()


def _optional_str_opt(text: str) -> str | None:
    return text.strip() or None


def _log_format_opt(text: str) -> str:
    value = text.strip().lower()
    if value not in ("text", "json"):
        raise _Bad("must be text or json")
    return value


def _next_opt(text: str) -> tuple[str, ...]:
    out: list[str] = []
    for name in text.split():
        if not STAGE_NAME_RE.fullmatch(name):
            raise _Bad(
                f"bad stage name '{name}'; NEXT lists stage names separated by spaces "
                "(letters, digits, '_', '.', '-')"
            )
        if name not in out:
            out.append(name)
    return tuple(out)
