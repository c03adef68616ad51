"""Logging set-up for the pepsi-dispatch tools.

One line per record::

    2026-11-29 19:00:00.123 INFO pepsi-dispatch[4711]: message

to stderr, or appended to a log file (re-opened when logrotate moves it away).
Modules log through ``logging.getLogger(__name__)``; this configures the root logger.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys

from pepsi_dispatch.errors import UsageError

__all__ = ["LEVELS", "logs_to_file", "parse_level", "setup_logging"]

#: Accepted -L values (case-insensitive); GNUnet's names map onto Python's levels.
LEVELS: dict[str, int] = {
    "DEBUG": logging.DEBUG,
    "BULK": logging.DEBUG,
    "INFO": logging.INFO,
    "MESSAGE": logging.INFO,
    "WARNING": logging.WARNING,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
    "NONE": logging.CRITICAL + 10,
}


class _Formatter(logging.Formatter):
    default_time_format = "%Y-%m-%d %H:%M:%S"
    default_msec_format = "%s.%03d"

    def __init__(self, program: str) -> None:
        super().__init__(f"%(asctime)s %(levelname)s {program}[%(process)d]: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        # Keep one record on one line: indent continuation lines (tracebacks included).
        return super().format(record).replace("\n", "\n    ")


def parse_level(level: str) -> int:
    """Map a level name (DEBUG, INFO, WARNING, ERROR; GNUnet names too) to a logging level.

    Raises:
        UsageError: unknown level name.
    """
    try:
        return LEVELS[level.strip().upper()]
    except KeyError:
        raise UsageError(
            f"invalid log level '{level}' (-L); use DEBUG, INFO, WARNING or ERROR"
        ) from None


def setup_logging(
    level: str, logfile: str | None = None, program: str = "pepsi-dispatch"
) -> logging.Handler:
    """Configure the root logger: ``level`` and above to stderr, or to ``logfile``.

    Replaces the handler installed by an earlier call. Returns the handler in use.

    Raises:
        UsageError: unknown level, or the log file cannot be opened.
    """
    numeric = parse_level(level)
    handler: logging.Handler
    if logfile:
        try:
            handler = logging.handlers.WatchedFileHandler(logfile, encoding="utf-8")
        except OSError as exc:
            raise UsageError(
                f"cannot open log file '{logfile}' (-l): {exc.strerror or exc}; "
                "fix the path or its permissions"
            ) from None
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(program))
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_pepsi", False):  # only ours: leave e.g. pytest's handlers alone
            root.removeHandler(old)
            old.close()
    handler._pepsi = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(numeric)
    logging.captureWarnings(True)
    return handler


def logs_to_file() -> bool:
    """True when :func:`setup_logging` sent the log to a file (not to stderr)."""
    return any(
        getattr(h, "_pepsi", False) and isinstance(h, logging.FileHandler)
        for h in logging.getLogger().handlers
    )
