"""pepsi.conf's schema: options, value types, defaults, stage graph, search order, overlay.

The file is read and its references expanded by :mod:`pepsi_dispatch.ini` (the
generic INI reader); this module says which sections and options exist, converts
and validates their values, and builds the :class:`Config`.

The file format (see docs/CONFIG.md for the operator's reference)::

    [PATHS]
    PEPSI_HOME = /var/lib/pepsi

    [database]
    DSN = postgresql:///pepsi        # PEPSI_DSN in the environment overrides it

    [pepsi-dispatch]
    MAX_RUNTIME = 5 min

    [stage-resize]
    PROGRAM = ${PEPSI_HOME}/bin/resize
    NEXT = upload

Section names and option names are case-insensitive (sections are stored
lower-case, options upper-case); stage names keep the spelling of their first
``[stage-NAME]`` header because the database compares them exactly.

Every error is a :class:`ConfigError` whose ``str()`` is one line::

    FILE:LINE: [section] OPTION = 'value': what is wrong; how to fix
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pepsi_dispatch.ini import BadValue as _Bad
from pepsi_dispatch.ini import ConfigError, Ini, expand_sections, merge_rows, read_file
from pepsi_dispatch.ini import error as _error
from pepsi_dispatch.ini import suggest as _suggest

__all__ = [
    "DEFAULT_DSN",
    "OVERLAY_ORIGIN",
    "SYSTEM_CONFIG",
    "Config",
    "ConfigError",
    "DispatchConfig",
    "StageConfig",
    "apply_overlay",
    "find_config",
    "load_config",
    "parse_bool",
    "parse_time",
    "reread_config",
]

DEFAULT_DSN = "postgresql:///pepsi"
#: The last file of the search order (a module attribute so tests can point it elsewhere).
SYSTEM_CONFIG = Path("/etc/pepsi.conf")
#: How errors name the database overlay instead of FILE:LINE.
OVERLAY_ORIGIN = "database overlay (pepsi.config)"

STAGE_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")

# --------------------------------------------------------------------------- values


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
    if not re.fullmatch(r"[0-9]+", s):
        raise _Bad(f"not a whole number; use an integer from {minimum} to {INT_MAX}")
    # Checked on the digits first: int() of thousands of digits raises a plain
    # ValueError (Python's int-string limit), which is no configuration error.
    digits = s.lstrip("0") or "0"
    n = int(digits) if len(digits) <= len(str(INT_MAX)) else INT_MAX + 1
    if n < minimum:
        what = "positive" if minimum == 1 else f">= {minimum}"
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


# --------------------------------------------------------------------------- dataclasses


@dataclass(frozen=True)
class StageConfig:
    """One ``[stage-NAME]`` section."""

    name: str
    program: str
    next: tuple[str, ...]
    parallelism: int = 4
    queue_limit: int = 4
    max_messages: int = 1000
    max_retries: int = 10
    #: PAUSED (an overlay option the dashboard sets): claim nothing for this stage.
    paused: bool = False
    #: Automatic retries (seconds; None = off): a failure the dispatcher sees is
    #: paused for retry_delay x 2^retries, capped by retry_delay_max, with jitter.
    retry_delay: float | None = None
    retry_delay_max: float | None = None
    worker_dsn: str | None = None  # WORKER_DSN: PEPSI_DSN of its workers (None: global)


@dataclass(frozen=True)
class DispatchConfig:
    """The ``[pepsi-dispatch]`` section; times in seconds."""

    max_runtime: float = 300.0
    worker_idle_timeout: float = 5.0
    poll_interval: float = 30.0
    stats_interval: float = 60.0
    db_pool_size: int = 8
    config_file: str | None = None
    service_user: str = "pepsi"
    shutdown_timeout: float = 10.0
    expiry: float = 86400.0
    competing: bool = False
    orphan_timeout: float = 300.0
    retention: float = 7 * 86400.0  # 0 = keep done rows
    worker_dsn: str | None = None  # WORKER_DSN: PEPSI_DSN of workers (None: the DSN)
    log_format: str = "text"  # LOG_FORMAT: text | json


@dataclass(frozen=True)
class Config:
    """A loaded, validated configuration."""

    path: Path | None  # file loaded (None = built-in defaults)
    dsn: str  # PEPSI_DSN env > [database] DSN > postgresql:///pepsi
    dispatch: DispatchConfig
    stages: dict[str, StageConfig]  # validated graph, in file order
    sections: dict[str, dict[str, str]]  # expanded values; lower-case sections, upper-case keys
    #: Extension: where each value came from, (section, OPTION) -> "FILE:LINE" or
    #: OVERLAY_ORIGIN; (section, "") is the section header.
    origins: dict[tuple[str, str], str] = field(default_factory=dict, repr=False, compare=False)


# option name -> (attribute, converter)
_DISPATCH_OPTIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "MAX_RUNTIME": ("max_runtime", _time_opt(False)),
    "WORKER_IDLE_TIMEOUT": ("worker_idle_timeout", _time_opt(True)),
    "POLL_INTERVAL": ("poll_interval", _poll_interval_opt),
    "STATS_INTERVAL": ("stats_interval", _time_opt(False)),
    "DB_POOL_SIZE": ("db_pool_size", _int_opt(1)),
    "CONFIG_FILE": ("config_file", _optional_str_opt),
    "SERVICE_USER": ("service_user", _str_opt),
    "SHUTDOWN_TIMEOUT": ("shutdown_timeout", _time_opt(True)),
    "EXPIRY": ("expiry", _time_opt(False)),
    "COMPETING": ("competing", _bool_value),
    "ORPHAN_TIMEOUT": ("orphan_timeout", _time_opt(False)),
    "RETENTION": ("retention", _time_opt(True)),
    "WORKER_DSN": ("worker_dsn", _optional_str_opt),
    "LOG_FORMAT": ("log_format", _log_format_opt),
}
_STAGE_OPTIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "PROGRAM": ("program", _str_opt),
    "NEXT": ("next", _next_opt),
    "PARALLELISM": ("parallelism", _int_opt(1)),
    "QUEUE_LIMIT": ("queue_limit", _int_opt(1)),
    "MAX_MESSAGES": ("max_messages", _int_opt(1)),
    "MAX_RETRIES": ("max_retries", _int_opt(0)),
    "PAUSED": ("paused", _bool_value),
    "RETRY_DELAY": ("retry_delay", _optional_time_opt),
    "RETRY_DELAY_MAX": ("retry_delay_max", _optional_time_opt),
    "WORKER_DSN": ("worker_dsn", _optional_str_opt),
}
_DATABASE_OPTIONS = ("DSN",)
_KNOWN_SECTIONS = ("paths", "database", "pepsi-dispatch")


def _is_stage_section(section: str) -> bool:
    return section.startswith("stage-")


def _check_section_names(raw: Ini) -> None:
    for sec in raw.sections:
        if sec in _KNOWN_SECTIONS or _is_stage_section(sec):
            continue
        origin = raw.origins.get((sec, ""))
        name = raw.names.get(sec, sec)
        if re.match(r"stages?([_. ]|$)|stages-", sec):
            rest = re.sub(r"^stages?[-_. ]?", "", name, flags=re.IGNORECASE) or "NAME"
            raise _error(
                f"not a stage section; stage sections are named [stage-{rest}]", origin, name
            )
        match = difflib.get_close_matches(sec, _KNOWN_SECTIONS, n=1, cutoff=0.85)
        if match:
            raise _error(f"unknown section; did you mean [{match[0]}]?", origin, name)


def _strict_section(section: str) -> bool:
    """Values that must expand: ours. [PATHS] entries and other tools' sections are
    only checked where they are used."""
    return section in ("database", "pepsi-dispatch") or _is_stage_section(section)


# --------------------------------------------------------------------------- building


def _convert(
    spec: Mapping[str, tuple[str, Callable[[str], Any]]],
    sec: str,
    display: str,
    opts: Mapping[str, str],
    origins: Mapping[tuple[str, str], str],
) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, value in opts.items():
        origin = origins.get((sec, key))
        if key not in spec:
            hint = _suggest(key, spec)
            known = ", ".join(spec)
            fix = hint or f"known options: {known}"
            raise _error(f"unknown option; {fix}", origin, display, key, value)
        attr, conv = spec[key]
        try:
            values[attr] = conv(value)
        except _Bad as exc:
            raise _error(str(exc), origin, display, key, value) from None
    return values


def _build_dispatch(
    sections: Mapping[str, Mapping[str, str]], origins: Mapping[tuple[str, str], str]
) -> DispatchConfig:
    opts = sections.get("pepsi-dispatch", {})
    return DispatchConfig(
        **_convert(_DISPATCH_OPTIONS, "pepsi-dispatch", "pepsi-dispatch", opts, origins)
    )


def _build_dsn(
    sections: Mapping[str, Mapping[str, str]],
    origins: Mapping[tuple[str, str], str],
    env: Mapping[str, str],
) -> str:
    opts = sections.get("database", {})
    for key, value in opts.items():
        if key not in _DATABASE_OPTIONS:
            hint = _suggest(key, _DATABASE_OPTIONS) or "the only option is DSN"
            raise _error(
                f"unknown option; {hint}", origins.get(("database", key)), "database", key, value
            )
    if env.get("PEPSI_DSN"):
        return env["PEPSI_DSN"]
    if "DSN" in opts:
        if not opts["DSN"].strip():
            raise _error(
                "empty DSN; set a libpq connection string such as postgresql:///pepsi",
                origins.get(("database", "DSN")),
                "database",
                "DSN",
                opts["DSN"],
            )
        return opts["DSN"].strip()
    return DEFAULT_DSN


def _check_capacity(
    stage: StageConfig,
    sec: str,
    display: str,
    opts: Mapping[str, str],
    origins: Mapping[tuple[str, str], str],
) -> None:
    """PARALLELISM x QUEUE_LIMIT is the stage's claim size, an int4 in the database."""
    if stage.parallelism * stage.queue_limit <= INT_MAX:
        return
    option = "QUEUE_LIMIT" if "QUEUE_LIMIT" in opts else "PARALLELISM"
    raise _error(
        f"PARALLELISM x QUEUE_LIMIT = {stage.parallelism * stage.queue_limit} is above"
        f" {INT_MAX}; lower one of them",
        origins.get((sec, option)) or origins.get((sec, "")),
        display,
        option,
        opts.get(option),
    )


def _build_stages(
    sections: Mapping[str, Mapping[str, str]],
    names: Mapping[str, str],
    origins: Mapping[tuple[str, str], str],
) -> dict[str, StageConfig]:
    stages: dict[str, StageConfig] = {}
    for sec, opts in sections.items():
        if not _is_stage_section(sec):
            continue
        display = names.get(sec, sec)
        header = origins.get((sec, ""))
        name = display[len("stage-") :]
        if not STAGE_NAME_RE.fullmatch(name):
            raise _error(
                f"bad stage name '{name}'; stage names may contain only letters, digits, "
                "'_', '.' and '-'",
                header,
                display,
            )
        values = _convert(_STAGE_OPTIONS, sec, display, opts, origins)
        if "program" not in values:
            raise _error(
                "PROGRAM is missing; add PROGRAM = /path/to/stage-program", header, display
            )
        values.setdefault("next", ())
        stages[name] = StageConfig(name=name, **values)
        _check_capacity(stages[name], sec, display, opts, origins)
    for name, stage in stages.items():
        for succ in stage.next:
            if succ in stages:
                continue
            sec = "stage-" + name.lower()
            hint = _suggest(succ, stages, quote="'")
            fix = f"{hint} " if hint else ""
            raise _error(
                f"NEXT names undefined stage '{succ}'; {fix}fix the name (stage names are "
                f"case-sensitive) or define [stage-{succ}]",
                origins.get((sec, "NEXT")),
                names.get(sec, sec),
                "NEXT",
                sections[sec].get("NEXT"),
            )
    return stages


# --------------------------------------------------------------------------- public API


def find_config(path: str | os.PathLike[str] | None = None) -> Path | None:
    """Return the configuration file to load, or None for built-in defaults.

    Order: ``path`` (``-c``), ``$PEPSI_CONFIG``, ``~/.config/pepsi.conf``,
    ``/etc/pepsi.conf`` (:data:`SYSTEM_CONFIG`). An explicit path or ``$PEPSI_CONFIG``
    that names no regular file is an error; the last two are simply skipped.

    Raises:
        ConfigError: an explicit file does not exist or is not a regular file.
    """
    explicit: list[tuple[str, str]] = []
    if path is not None:
        explicit.append((os.fspath(path), "-c"))
    elif os.environ.get("PEPSI_CONFIG"):
        explicit.append((os.environ["PEPSI_CONFIG"], "$PEPSI_CONFIG"))
    for given, how in explicit:
        p = Path(given).expanduser()
        if not p.exists():
            raise _error(
                f"configuration file does not exist (given by {how}); check the path", given
            )
        if not p.is_file():
            raise _error(f"not a regular file (given by {how}); name a pepsi.conf file", given)
        return p.absolute()  # a reload after a chdir must find the same file
    candidates: list[Path] = []
    try:
        candidates.append(Path.home() / ".config" / "pepsi.conf")
    except (RuntimeError, KeyError):
        pass  # no home directory: skip it
    candidates.append(SYSTEM_CONFIG)
    for cand in candidates:
        if cand.is_file():
            return cand
    return None


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Find, parse, expand and validate pepsi.conf (see :func:`find_config` for the order).

    Raises:
        ConfigError: anything wrong, as one line naming file, line, section, option, value.
    """
    return _load(find_config(path))


def reread_config(config: Config) -> Config:
    """Read ``config.path`` again (for a reload), without searching again.

    A dispatcher that started without a file stays without one even if, after
    dropping privileges, the service user's ``~/.config/pepsi.conf`` exists. The
    result keeps ``config.dsn`` and ``config.dispatch``: [database] and
    [pepsi-dispatch] are read once; only the stage graph (and ``sections``) is new.
    Apply the overlay to the result with :func:`apply_overlay`.

    Raises:
        ConfigError: the file no longer parses (or is no longer readable).
    """
    fresh = _load(config.path)
    return dataclasses.replace(fresh, dsn=config.dsn, dispatch=config.dispatch)


def _load(file: Path | None) -> Config:
    raw = Ini()
    env = os.environ
    if file is not None:
        read_file(file, raw, env)
    _check_section_names(raw)
    sections = expand_sections(raw, env, _strict_section)
    return Config(
        path=file,
        dsn=_build_dsn(sections, raw.origins, env),
        dispatch=_build_dispatch(sections, raw.origins),
        stages=_build_stages(sections, raw.names, raw.origins),
        sections=sections,
        origins=dict(raw.origins),
    )


def apply_overlay(config: Config, rows: Iterable[tuple[str, str, str | None]]) -> Config:
    """Merge ``pepsi.config`` rows (section, option, value) into ``config``.

    Only ``[stage-*]`` rows are applied (they override file values and may add whole
    stages); rows for other sections are ignored. Values are expanded like file values.
    The stage graph is validated again. ``config`` itself is not changed.

    Raises:
        ConfigError: a bad row or a graph that does not parse, naming the database overlay.
    """
    merged = Ini(
        sections={sec: dict(opts) for sec, opts in config.sections.items()},
        names={"stage-" + name.lower(): "stage-" + name for name in config.stages},
        origins=dict(config.origins),
    )
    merge_rows(merged, rows, OVERLAY_ORIGIN, _is_stage_section, os.environ)
    stages = _build_stages(merged.sections, merged.names, merged.origins)
    return dataclasses.replace(
        config, stages=stages, sections=merged.sections, origins=merged.origins
    )
