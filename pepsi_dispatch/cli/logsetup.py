"""Logging set-up for the pepsi-dispatch tools.

One line per record::

    2026-11-29 19:00:00.123+01:00 INFO pepsi-dispatch[4711]: message

to stderr, or appended to a log file (re-opened when logrotate moves it away).
``LOG_FORMAT = json`` makes that one JSON object per line instead (keys ``time``,
``level``, ``program``, ``pid``, ``logger``, ``message``). Under systemd, when
stderr is the journal's stream (``$JOURNAL_STREAM``), text lines drop their
timestamp (journald adds its own) and start with the syslog priority, ``<3>``
for errors, so the journal keeps each line's level.
Modules log through ``logging.getLogger(__name__)``; this configures the root logger.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import sys
from datetime import datetime

from pepsi_dispatch.errors import UsageError

__all__ = ["FORMATS", "LEVELS", "logs_to_file", "parse_level", "setup_logging"]

#: LOG_FORMAT values.
FORMATS = ("text", "json")

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


class _LogFile(logging.handlers.WatchedFileHandler):
    """The log file; a write that fails (a full filesystem, an I/O error) never stops
    or slows the program and never floods stderr with tracebacks.

    The first failure says so in one line on stderr (the service manager's log) and
    the file is closed; later records are counted and dropped while writing still
    fails (each emit tries to reopen and write). The first record that gets through
    again is preceded in the file by a line saying how many were dropped, and stderr
    says the file is written again.
    """

    def __init__(self, filename: str) -> None:
        #: this process made the file (it did not exist): a root that drops its
        #: privileges hands it to SERVICE_USER (privileges.hand_over_logs)
        self.created = not os.path.lexists(filename)
        super().__init__(filename, encoding="utf-8")
        self.dropped = 0
        self.failing: str | None = None  # the error while writes fail
        self._errors = 0  # handleError calls during the current emit

    def emit(self, record: logging.LogRecord) -> None:
        self._errors = 0
        was_failing = self.failing
        if was_failing is not None:
            super().emit(
                logging.makeLogRecord(
                    {
                        "name": __name__,
                        "levelno": logging.WARNING,
                        "levelname": "WARNING",
                        "msg": f"log file: {self.dropped} line(s) dropped while it could not"
                        f" be written ({was_failing})",
                    }
                )
            )
            if self._errors:  # still failing: counted (as this record) by _failed
                return
        super().emit(record)  # errors come back through handleError
        if was_failing is not None and not self._errors:
            _stderr(f"log file {self.baseFilename}: written again ({self.dropped} line(s) lost)")
            self.failing = None
            self.dropped = 0

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - stdlib name
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            self._failed(exc)
        else:
            super().handleError(record)

    def _failed(self, exc: OSError) -> None:
        self._errors += 1
        if self.failing is None:
            self.dropped = 1
            self.failing = exc.strerror or str(exc)
            _stderr(
                f"log file {self.baseFilename}: cannot write ({self.failing}); log lines are"
                " dropped (and counted) until it can be written again"
            )
        elif self._errors == 1:
            self.dropped += 1
        stream, self.stream = self.stream, None
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass  # its buffer could not be written either: dropped


def _stderr(line: str) -> None:
    try:
        sys.stderr.write(f"pepsi-dispatch[{os.getpid()}]: {line}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _timestamp(record: logging.LogRecord) -> str:
    """Local time with its UTC offset, milliseconds: 2026-11-29 19:00:00.123+01:00."""
    when = datetime.fromtimestamp(record.created).astimezone()
    return when.isoformat(sep=" ", timespec="milliseconds")


class _Formatter(logging.Formatter):
    def __init__(self, program: str, journal: bool = False) -> None:
        self.journal = journal
        fmt = f"%(levelname)s {program}[%(process)d]: %(message)s"
        super().__init__(fmt if journal else "%(asctime)s " + fmt)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return _timestamp(record)

    def format(self, record: logging.LogRecord) -> str:
        # Keep one record on one line: indent continuation lines (tracebacks included).
        text = super().format(record).replace("\n", "\n    ")
        if self.journal:
            return f"<{_syslog_priority(record.levelno)}>{text}"
        return text


class _JsonFormatter(logging.Formatter):
    def __init__(self, program: str) -> None:
        super().__init__()
        self.program = program

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": _timestamp(record),
            "level": record.levelname,
            "program": self.program,
            "pid": record.process,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def _syslog_priority(levelno: int) -> int:
    """sd-daemon(3) prefixes: 3 err, 4 warning, 6 info, 7 debug (2 crit)."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


def _stderr_is_journal() -> bool:
    """True when stderr is the stream systemd connected to the journal ($JOURNAL_STREAM)."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    if not stream:
        return False
    try:
        dev, ino = (int(x) for x in stream.split(":"))
        st = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def parse_level(level: str) -> int:
    """Map a level name (DEBUG, INFO, WARNING, ERROR; GNUnet names too) to a logging level.

    Raises:
        UsageError: unknown level name.
    """
    try:
        return LEVELS[level.strip().upper()]
    except KeyError:
        raise UsageError(
            f"invalid log level '{level}' (-L); use DEBUG, INFO, WARNING, ERROR or NONE"
            " (also BULK, MESSAGE, WARN)"
        ) from None


def setup_logging(
    level: str,
    logfile: str | None = None,
    log_format: str = "text",
    program: str = "pepsi-dispatch",
) -> logging.Handler:
    """Configure the root logger: ``level`` and above to stderr, or to ``logfile``.

    ``log_format`` is ``text`` or ``json`` (LOG_FORMAT).

    Replaces the handler installed by an earlier call. Returns the handler in use.

    Raises:
        UsageError: unknown level, or the log file cannot be opened.
    """
    numeric = parse_level(level)
    handler: logging.Handler
    if logfile:
        try:
            handler = _LogFile(logfile)
        except OSError as exc:
            raise UsageError(
                f"cannot open log file '{logfile}' (-l): {exc.strerror or exc}; "
                "fix the path or its permissions"
            ) from None
    else:
        handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(_JsonFormatter(program))
    else:
        handler.setFormatter(_Formatter(program, journal=not logfile and _stderr_is_journal()))
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
