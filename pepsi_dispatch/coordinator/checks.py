"""Start-up checks: problems that would only show up later must show up at start.

``serve`` runs :func:`program_checks` as the service user (after dropping
privileges) and refuses to start (exit 2) when a PROGRAM cannot run;
``serve --check`` runs every check, prints each result and exits 0 or 2
without serving, like ``nginx -t``. The checks that ask the database are in
``coordinator/database/preflight.py`` (every SQL statement of the coordinator
lives under ``coordinator/database/``).
"""

from __future__ import annotations

import grp
import os
import pwd
import shlex
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pepsi_dispatch.config import Config
from pepsi_dispatch.config import load as _config

__all__ = [
    "Check",
    "no_config_problem",
    "overlay_program_problems",
    "program_checks",
    "program_problem",
    "unit_read_checks",
]


@dataclass(frozen=True)
class Check:
    """One line of ``serve --check``. A warning (``warn``) is shown but does not
    fail the check: the dispatcher would start anyway."""

    name: str
    ok: bool
    detail: str
    warn: bool = False

    def line(self) -> str:
        mark = "warn" if self.warn else "ok  " if self.ok else "FAIL"
        return f"{mark} {self.name}: {self.detail}"


def current_user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def _why_not_executable(path: str) -> str:
    """Why the current user cannot execute ``path`` (which exists for root, maybe)."""
    real = os.path.realpath(path)
    via = f" (it resolves to {real})" if real != os.path.abspath(path) else ""
    for name in (path, real):
        for parent in reversed(Path(os.path.abspath(name)).parents):
            if not os.access(parent, os.X_OK):
                if not os.path.lexists(parent):  # its own parent was searchable
                    return f"it does not exist (no directory {parent}){via}"
                return f"directory {parent} is not searchable by {current_user()}{via}"
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return f"it does not exist{via}"
    except OSError as exc:
        return f"{exc.strerror}{via}"
    if stat.S_ISDIR(st.st_mode):
        return f"it is a directory{via}"
    owner = st.st_uid
    try:
        owner_name = pwd.getpwuid(owner).pw_name
    except KeyError:
        owner_name = str(owner)
    mode = stat.filemode(st.st_mode)
    return f"no execute permission for {current_user()} ({mode}, owner {owner_name}){via}"


def _runnable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def program_problem(program: str, search_path: str | None = None) -> str | None:
    """What keeps the current user from running ``program`` (a PROGRAM value), or None.

    Checks the executable (found on PATH unless it has a '/'), and for a script its
    ``#!`` interpreter (and, for ``#!/usr/bin/env NAME``, NAME on PATH).
    """
    search_path = search_path if search_path is not None else os.environ.get("PATH", os.defpath)
    try:
        argv = shlex.split(program)
    except ValueError as exc:
        return f"PROGRAM {program!r} does not split into words: {exc}"
    if not argv:
        return "PROGRAM is empty"
    exe = argv[0]
    if "/" not in exe:
        found = shutil.which(exe, path=search_path)
        if found is None:
            return f"PROGRAM {exe!r} is not found on PATH ({search_path}) for {current_user()}"
        exe = found
    if not _runnable(exe):
        if not os.path.lexists(exe) and os.access(os.path.dirname(os.path.abspath(exe)), os.X_OK):
            return f"PROGRAM {exe} does not exist"
        return f"PROGRAM {exe} is not executable by {current_user()}: {_why_not_executable(exe)}"
    try:
        with open(exe, "rb") as f:
            head = f.read(256)
    except OSError as exc:
        who = current_user()
        return f"PROGRAM {exe} is not readable by {who} ({exc.strerror}); a script needs read"
    if not head.startswith(b"#!"):
        return None  # a binary: the kernel runs it
    return _interpreter_problem(exe, head, search_path)


def _interpreter_problem(exe: str, head: bytes, search_path: str) -> str | None:
    """What keeps the ``#!`` interpreter of the script ``exe`` from running, or None."""
    line = head[2:].split(b"\n", 1)[0].decode(errors="replace").strip()
    words = line.split(None, 1)
    if not words:
        return f"PROGRAM {exe} has an empty #! line"
    interp = words[0]
    if not _runnable(interp):
        return (
            f"interpreter {interp} of PROGRAM {exe} (its #! line) is not executable by"
            f" {current_user()}: {_why_not_executable(interp)}"
        )
    if os.path.basename(interp) == "env" and len(words) > 1:
        args = [a for a in words[1].split() if not a.startswith("-")]
        if args:
            name = args[0]
            found = shutil.which(name, path=search_path)
            if found is None:
                return (
                    f"interpreter {name} of PROGRAM {exe} (#!{line}) is not found on PATH"
                    f" ({search_path}) for {current_user()}"
                )
            if not _runnable(os.path.realpath(found)):
                return (
                    f"interpreter {found} of PROGRAM {exe} (#!{line}) is not executable by"
                    f" {current_user()}: {_why_not_executable(found)}"
                )
    return None


def readable_without_dac_override(path: str) -> bool:
    """Could root read ``path`` by its mode bits alone, without CAP_DAC_OVERRIDE?

    The shipped systemd unit keeps only CAP_SETUID and CAP_SETGID in the
    capability bounding set, so the dispatcher, started as root, reads its
    configuration as any user would: by owner, group and other bits (and the
    search bit of every directory above). A root shell passes checks that the
    unit then fails.
    """
    groups = {os.getegid(), *os.getgroups()}
    target = os.path.abspath(path)
    parents = [os.path.dirname(target)]
    while parents[-1] != os.path.dirname(parents[-1]):
        parents.append(os.path.dirname(parents[-1]))
    wanted = [(target, 4), *((d, 1) for d in parents)]  # read the file, search each dir
    for where, bit in wanted:
        try:
            st = os.stat(where)
        except OSError:
            return False
        if st.st_uid == os.geteuid():
            shift = 6
        elif st.st_gid in groups:
            shift = 3
        else:
            shift = 0
        if not (st.st_mode >> shift) & bit:
            return False
    return True


def _primary_group(user: str) -> str:
    try:
        return grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name
    except KeyError:
        return "GROUP"


def unit_read_checks(paths: Iterable[str], service_user: str) -> list[Check]:
    """As root: each configuration file must be readable without CAP_DAC_OVERRIDE,
    which the shipped systemd unit drops (its CapabilityBoundingSet keeps only
    CAP_SETUID and CAP_SETGID). Checked before the privilege drop; no check
    when not root."""
    if os.geteuid() != 0:
        return []
    out = []
    group = _primary_group(service_user)
    for path in paths:
        if readable_without_dac_override(path):
            continue
        out.append(
            Check(
                "configuration file",
                False,
                f"{path} is readable by root only through CAP_DAC_OVERRIDE, which the shipped"
                " unit drops (CapabilityBoundingSet=CAP_SETUID CAP_SETGID): the service would"
                f" fail to start; make it root's, readable by SERVICE_USER's group: chown"
                f" root:{group} {path} && chmod 0640 {path}",
            )
        )
    return out


def program_checks(config: Config) -> list[Check]:
    """One check per stage: its PROGRAM (and interpreter) runnable by the current user;
    a problem names where PROGRAM is set (``FILE:LINE``) when the configuration knows."""
    out = []
    for stage in config.stages.values():
        problem = program_problem(stage.program)
        where = config.origins.get((f"stage-{stage.name}".lower(), "PROGRAM"))
        if problem and where:
            problem += f" (set at {where}: [stage-{stage.name}] PROGRAM)"
        out.append(
            Check(
                f"stage {stage.name}",
                problem is None,
                problem or f"PROGRAM {stage.program} runnable by {current_user()}",
            )
        )
    return out


def overlay_program_problems(file_config: Config, config: Config) -> list[str]:
    """What is wrong with each PROGRAM that only the database overlay sets (a
    new stage, or a changed PROGRAM): the same check as the file's, with the
    overlay row named so the reader knows where to fix it.

    Unlike the file's, these do not stop the dispatcher from starting: the
    overlay changes at run time, and a stage whose PROGRAM cannot run is held
    off (its rows wait as pending) until the row is fixed, while the other
    stages run."""
    problems = []
    for name, stage in config.stages.items():
        before = file_config.stages.get(name)
        if before is not None and before.program == stage.program:
            continue  # the file's PROGRAM: checked with the file
        problem = program_problem(stage.program)
        if problem:
            problems.append(
                f"stage {name}: {problem} (PROGRAM set in the database overlay:"
                f" pepsi.config row [stage-{name}] PROGRAM; fix or delete that row)"
            )
    return problems


def searched_locations() -> list[str]:
    """Where the configuration was looked for; a file skipped as unreadable says so."""
    home = os.environ.get("HOME") or "~"
    searched = [Path(f"{home}/.config/pepsi.conf"), _config.SYSTEM_CONFIG]
    return ["-c (not given)", "$PEPSI_CONFIG (not set)"] + [
        f"{p} (not readable by this user)" if p.is_file() and not _config.readable(p) else str(p)
        for p in searched
    ]


def no_config_problem(config: Config) -> str | None:
    """A dispatcher with no file and no stage would only take the lock: refuse it."""
    if config.path is not None or config.stages:
        return None
    return (
        "no configuration file found (looked at: "
        + ", ".join(searched_locations())
        + ") and no stage defined; give one with -c FILE or PEPSI_CONFIG"
    )
