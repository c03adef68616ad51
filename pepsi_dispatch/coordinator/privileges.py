"""Dropping root privileges to the service account before connecting or starting workers."""

from __future__ import annotations

import grp
import logging
import logging.handlers
import os
import pwd
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pepsi_dispatch.errors import FatalError, UsageError

if TYPE_CHECKING:
    from pepsi_dispatch.config import Config

__all__ = ["check_access", "config_files", "drop_privileges", "hand_over_logs", "log_files"]

log = logging.getLogger(__name__)


def drop_privileges(user: str) -> None:
    """Become ``user`` (uid, primary gid and supplementary groups) if running as root.

    Not root: nothing to do (logged at DEBUG). Root: switch groups, gid and uid for good
    (real, effective and saved ids), set HOME, USER and LOGNAME, and check that the
    switch cannot be undone. ``SERVICE_USER = root`` keeps root (with a warning).

    Raises:
        UsageError: unknown user (exit 2).
        FatalError: the switch failed or could be undone (exit 1).
    """
    if os.geteuid() != 0:
        log.debug("not running as root (euid %d): keeping the current user", os.geteuid())
        return
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise UsageError(
            f"unknown SERVICE_USER '{user}' in [pepsi-dispatch]; "
            "create the account or set SERVICE_USER"
        ) from None
    if pw.pw_uid == 0:
        log.warning("SERVICE_USER '%s' is root: not dropping privileges", user)
        return
    hand_over_logs(pw.pw_uid, pw.pw_gid)
    try:
        groups = os.getgrouplist(pw.pw_name, pw.pw_gid)
        os.setgroups(groups)
        os.setgid(pw.pw_gid)
        os.setuid(pw.pw_uid)
    except OSError as exc:
        raise FatalError(f"cannot switch to SERVICE_USER '{user}': {exc}") from None
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:
        raise FatalError(f"switched to SERVICE_USER '{user}' but could regain root; refusing")
    os.environ["HOME"] = pw.pw_dir
    os.environ["USER"] = pw.pw_name
    os.environ["LOGNAME"] = pw.pw_name
    names = []
    for gid in groups:
        try:
            names.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            names.append(str(gid))
    log.info(
        "dropped privileges to %s (uid %d, gid %d, groups %s)",
        pw.pw_name,
        pw.pw_uid,
        pw.pw_gid,
        ",".join(names),
    )


def config_files(config: Config) -> list[str]:
    """The configuration file and every file it includes (from the values' origins)."""
    from pepsi_dispatch.config import OVERLAY_ORIGIN

    files: list[str] = [str(config.path)] if config.path is not None else []
    for origin in config.origins.values():
        if origin == OVERLAY_ORIGIN:
            continue
        name = origin.rsplit(":", 1)[0]
        if name not in files:
            files.append(name)
    return files


def log_files() -> list[str]:
    """Paths of the log files the root logger writes to (reopened by path on rotation)."""
    return [
        h.baseFilename
        for h in logging.getLogger().handlers
        if isinstance(h, logging.handlers.WatchedFileHandler)
    ]


def hand_over_logs(uid: int, gid: int) -> list[str]:
    """Give the log files this process created (``-l``, opened as root before the
    drop) to the service user, so it can reopen them after a rotation; a file
    that existed keeps its owner. Returns the paths handed over.

    Raises:
        UsageError: a created file cannot be given away (exit 2).
    """
    done: list[str] = []
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.handlers.WatchedFileHandler) and getattr(h, "created", False):
            try:
                os.chown(h.baseFilename, uid, gid)
            except OSError as exc:
                raise UsageError(
                    f"cannot give log file '{h.baseFilename}' to uid {uid}: {exc}"
                ) from None
            h.created = False  # type: ignore[attr-defined]
            done.append(h.baseFilename)
    return done


def check_access(config: Iterable[str], logs: Iterable[str]) -> None:
    """After dropping privileges: can we still read our configuration and reopen our logs?

    A reload reads the configuration file (and what it includes) again, and a
    log file is reopened by path after logrotate moved it: both happen as the
    service user, long after start-up, when failing means a dispatcher that
    stops or goes silent. So they are checked at once.

    Raises:
        UsageError: a file is not readable, or a log file not writable (exit 2).
    """
    bad: list[str] = []
    for path in config:
        if not os.access(path, os.R_OK):
            bad.append(f"configuration file '{path}' is not readable")
    for path in logs:
        if not os.access(path, os.W_OK):
            bad.append(
                f"log file '{path}' is not writable (it could not be reopened after a rotation)"
            )
        elif not os.access(os.path.dirname(path) or ".", os.W_OK | os.X_OK):
            log.warning(
                "log directory of '%s' is not writable by uid %d: if logrotate moves the file,"
                " it must create the new one for this user (create MODE USER GROUP) or use"
                " copytruncate",
                path,
                os.geteuid(),
            )
    if bad:
        who = pwd.getpwuid(os.geteuid()).pw_name if _known_uid() else str(os.geteuid())
        raise UsageError(f"as {who} (SERVICE_USER): " + "; ".join(bad))


def _known_uid() -> bool:
    try:
        pwd.getpwuid(os.geteuid())
    except KeyError:
        return False
    return True
