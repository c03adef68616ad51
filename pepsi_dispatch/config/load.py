"""pepsi.conf's schema: options, value types, defaults, stage graph, search order, overlay.

The file is read and its references expanded by :mod:`pepsi_dispatch.config.ini` (the
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
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pepsi_dispatch.config.ini import BadValue as _Bad
from pepsi_dispatch.config.ini import Ini, expand_sections, merge_rows, read_file
from pepsi_dispatch.config.ini import error as _error
from pepsi_dispatch.config.ini import suggest as _suggest
from pepsi_dispatch.config.model import Config, DispatchConfig, StageConfig
from pepsi_dispatch.config.schedule import (
    ScheduleConfig,
    catch_up_opt,
    cron_opt,
    dedupe_key_opt,
    every_opt,
    payload_opt,
    priority_opt,
    timezone_opt,
)
from pepsi_dispatch.config.values import (
    _bool_value,
    _int_opt,
    _log_format_opt,
    _next_opt,
    _optional_str_opt,
    _optional_time_opt,
    _poll_interval_opt,
    _str_opt,
    _time_opt,
)
from pepsi_dispatch.contract import STAGE_NAME_RE

_log = logging.getLogger(__name__)

DEFAULT_DSN = "postgresql:///pepsi"
#: The last file of the search order (a module attribute so tests can point it elsewhere).
SYSTEM_CONFIG = Path("/etc/pepsi.conf")
#: How errors name the database overlay instead of FILE:LINE.
OVERLAY_ORIGIN = "database overlay (pepsi.config)"


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
    "MIN_WORKERS": ("min_workers", _int_opt(0)),
    "MAX_RETRIES": ("max_retries", _int_opt(0)),
    "PAUSED": ("paused", _bool_value),
    "RETRY_DELAY": ("retry_delay", _optional_time_opt),
    "RETRY_DELAY_MAX": ("retry_delay_max", _optional_time_opt),
    "WORKER_DSN": ("worker_dsn", _optional_str_opt),
}
_SCHEDULE_OPTIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "STAGE": ("stage", _str_opt),
    "PAYLOAD": ("payload", payload_opt),
    "CRON": ("cron", cron_opt),
    "EVERY": ("every", every_opt),
    "TIMEZONE": ("timezone", timezone_opt),
    "CATCH_UP": ("catch_up", catch_up_opt),
    "PRIORITY": ("priority", priority_opt),
    "DEDUPE_KEY": ("dedupe_key", dedupe_key_opt),
}
_DATABASE_OPTIONS = ("DSN",)
_KNOWN_SECTIONS = ("paths", "database", "pepsi-dispatch")


def _is_stage_section(section: str) -> bool:
    return section.startswith("stage-")


def _is_schedule_section(section: str) -> bool:
    return section.startswith("schedule-")


def _is_overlay_section(section: str) -> bool:
    """Sections the database overlay may set: [stage-*] and [schedule-*]."""
    return _is_stage_section(section) or _is_schedule_section(section)


def _check_section_names(raw: Ini) -> None:
    for sec in raw.sections:
        if sec in _KNOWN_SECTIONS or _is_overlay_section(sec):
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
    return section in ("database", "pepsi-dispatch") or _is_overlay_section(section)


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


def _check_min_workers(
    stage: StageConfig,
    sec: str,
    display: str,
    opts: Mapping[str, str],
    origins: Mapping[tuple[str, str], str],
) -> None:
    """MIN_WORKERS workers hold PARALLELISM slots: it cannot be above PARALLELISM."""
    if stage.min_workers <= stage.parallelism:
        return
    raise _error(
        f"MIN_WORKERS ({stage.min_workers}) is above PARALLELISM ({stage.parallelism});"
        f" use at most {stage.parallelism}, or raise PARALLELISM",
        origins.get((sec, "MIN_WORKERS")) or origins.get((sec, "")),
        display,
        "MIN_WORKERS",
        opts.get("MIN_WORKERS"),
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
        _check_min_workers(stages[name], sec, display, opts, origins)
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


def _build_schedules(
    sections: Mapping[str, Mapping[str, str]],
    names: Mapping[str, str],
    origins: Mapping[tuple[str, str], str],
    stages: Mapping[str, StageConfig],
) -> dict[str, ScheduleConfig]:
    schedules: dict[str, ScheduleConfig] = {}
    for sec, opts in sections.items():
        if not _is_schedule_section(sec):
            continue
        display = names.get(sec, sec)
        header = origins.get((sec, ""))
        name = display[len("schedule-") :]
        if not STAGE_NAME_RE.fullmatch(name):
            raise _error(
                f"bad schedule name '{name}'; schedule names may contain only letters,"
                " digits, '_', '.' and '-'",
                header,
                display,
            )
        values = _convert(_SCHEDULE_OPTIONS, sec, display, opts, origins)
        if "stage" not in values:
            raise _error("STAGE is missing; add STAGE = the stage to enqueue at", header, display)
        if values["stage"] not in stages:
            hint = _suggest(values["stage"], stages, quote="'")
            raise _error(
                f"STAGE names undefined stage '{values['stage']}'; {hint + ' ' if hint else ''}"
                f"define [stage-{values['stage']}] or fix the name",
                origins.get((sec, "STAGE")),
                display,
                "STAGE",
                opts.get("STAGE"),
            )
        if ("cron" in values) == ("every" in values):
            both = "cron" in values
            raise _error(
                "set exactly one of CRON (5 fields) and EVERY (a duration),"
                + (" not both" if both else " e.g. EVERY = 1 h"),
                origins.get((sec, "EVERY" if both else "")) or header,
                display,
                "EVERY" if both else None,
                opts.get("EVERY") if both else None,
            )
        catch_up = values.pop("catch_up", None)
        if catch_up is not None:
            values["catch_up"], values["catch_up_ticks"] = catch_up.seconds, catch_up.ticks
        schedules[name] = ScheduleConfig(name=name, **values)
    return schedules


# --------------------------------------------------------------------------- public API


def find_config(path: str | os.PathLike[str] | None = None) -> Path | None:
    """Return the configuration file to load, or None for built-in defaults.

    Order: ``path`` (``-c``), ``$PEPSI_CONFIG``, ``~/.config/pepsi.conf``,
    ``/etc/pepsi.conf`` (:data:`SYSTEM_CONFIG`). An explicit path or ``$PEPSI_CONFIG``
    that names no regular file is an error; the last two are simply skipped when
    absent or not readable by this user (a deployment's /etc/pepsi.conf is the
    service's, 0640 root:pepsi with WORKER_DSN's password: people's ``pepsi-queue``
    runs without it, on ``$PEPSI_DSN``).

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
            if readable(cand):
                return cand
            _log.debug("skipping %s: not readable by this user", cand)
    return None


def readable(path: Path) -> bool:
    """Whether this process's (real) user may read ``path``."""
    return os.access(path, os.R_OK)


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
    stages = _build_stages(sections, raw.names, raw.origins)
    return Config(
        path=file,
        dsn=_build_dsn(sections, raw.origins, env),
        dispatch=_build_dispatch(sections, raw.origins),
        stages=stages,
        sections=sections,
        origins=dict(raw.origins),
        schedules=_build_schedules(sections, raw.names, raw.origins, stages),
    )


def _drop_pause_only_sections(merged: Ini, config: Config) -> None:
    """Leave out overlay sections of stages the file does not define that say only PAUSED.

    Such a section names no PROGRAM, so it is no stage; it is what pausing a stage
    leaves behind once the stage is dropped from the file (or what a pause of an
    unknown name wrote before the database refused those). Parsing it would make the
    graph fail: a reload would end the dispatcher and every restart exit 2 while the
    row stays. It is ignored, with a warning naming the row to delete.
    """
    for sec in [k for k in merged.sections if _is_stage_section(k) and k not in config.sections]:
        if set(merged.sections[sec]) == {"PAUSED"}:
            name = merged.names.get(sec, sec)
            _log.warning(
                "database overlay: [%s] has only PAUSED and no PROGRAM: no such stage, ignored"
                " (remove its row from pepsi.config: pepsi-queue resume %s)",
                name,
                name.partition("-")[2],
            )
            del merged.sections[sec]
            merged.names.pop(sec, None)
            for key in [k for k in merged.origins if k[0] == sec]:
                del merged.origins[key]


def apply_overlay(config: Config, rows: Iterable[tuple[str, str, str | None]]) -> Config:
    """Merge ``pepsi.config`` rows (section, option, value) into ``config``.

    Only ``[stage-*]`` and ``[schedule-*]`` rows are applied (they override file
    values and may add whole stages and schedules); rows for other sections are
    ignored. Values are expanded like file values. The stage graph and the
    schedules are validated again. ``config`` itself is not changed.
    An overlay section of a stage the file does not define that holds only PAUSED is
    ignored with a warning (see :func:`_drop_pause_only_sections`): pausing can never
    make the graph stop parsing.

    Raises:
        ConfigError: a bad row or a graph that does not parse, naming the database overlay.
    """
    merged = Ini(
        sections={sec: dict(opts) for sec, opts in config.sections.items()},
        names={
            **{"stage-" + name.lower(): "stage-" + name for name in config.stages},
            **{"schedule-" + name.lower(): "schedule-" + name for name in config.schedules},
        },
        origins=dict(config.origins),
    )
    merge_rows(merged, rows, OVERLAY_ORIGIN, _is_overlay_section, os.environ)
    _drop_pause_only_sections(merged, config)
    stages = _build_stages(merged.sections, merged.names, merged.origins)
    schedules = _build_schedules(merged.sections, merged.names, merged.origins, stages)
    return dataclasses.replace(
        config,
        stages=stages,
        schedules=schedules,
        sections=merged.sections,
        origins=merged.origins,
    )
