"""Dropping root privileges to the service account before connecting or starting workers."""

from __future__ import annotations

import grp
import logging
import os
import pwd

from pepsi_dispatch.errors import FatalError, UsageError

__all__ = ["drop_privileges"]

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
