"""Start-up checks: problems that would only show up later must show up at start.

``serve`` runs :func:`program_checks` as the service user (after dropping
privileges) and refuses to start (exit 2) when a PROGRAM cannot run;
``serve --check`` runs every check (:func:`run_all`), prints each result and
exits 0 or 2 without serving, like ``nginx -t``.
"""

from __future__ import annotations

import grp
import os
import pwd
import shlex
import shutil
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from pepsi_dispatch.config import Config
from pepsi_dispatch.config import load as _config
from pepsi_dispatch.pooling import behind_pooler

__all__ = [
    "DISPATCHER_FUNCTIONS",
    "STAGE_FUNCTIONS",
    "Check",
    "database_checks",
    "no_config_problem",
    "program_checks",
    "program_problem",
    "session_check",
]

#: What the dispatcher's role executes (database/calls.py), and what a stage program's
#: role does (SDK).
DISPATCHER_FUNCTIONS = (
    "register_dispatcher",
    "heartbeat",
    "unregister_dispatcher",
    "claim",
    "claim_lines",
    "requeue_due",
    "reset_orphans",
    "release",
    "record_dispatch_error",
    "check_answered",
    "flush_stats",
    "purge_done",
    "keep_dead_letters",
    "stage_config",
    "register_stages",
    "dispatcher_registered",
    "held_ids",
    "stages_of",
    "queue_dispatchers",
)
STAGE_FUNCTIONS = (
    "get_message",
    "get_messages",
    "advance",
    "finish",
    "pause",
    "fail",
    "set_state",
    "hop",
    "stage_config",
    "enqueue",
)


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
    """One check per stage: its PROGRAM (and interpreter) runnable by the current user."""
    out = []
    for stage in config.stages.values():
        problem = program_problem(stage.program)
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


def overlay_checks(config: Config) -> list[Check]:
    """``serve --check``: a warning per PROGRAM the database overlay sets that
    cannot run (none when the database or its overlay cannot be read: the
    database checks say why); a graph the overlay breaks fails."""
    import psycopg

    try:
        with psycopg.connect(config.dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT * FROM pepsi.stage_config()").fetchall()
    except psycopg.Error:
        return []
    try:
        overlaid = _config.apply_overlay(config, [tuple(r[:3]) for r in rows])
    except _config.ConfigError as exc:
        return [Check("database overlay", False, str(exc))]
    problems = overlay_program_problems(config, overlaid)
    return [Check("database overlay", True, p, warn=True) for p in problems]


def searched_locations() -> list[str]:
    home = os.environ.get("HOME") or "~"
    return [
        "-c (not given)",
        "$PEPSI_CONFIG (not set)",
        f"{home}/.config/pepsi.conf",
        str(_config.SYSTEM_CONFIG),
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


def _function_grants(conn, names: Iterable[str]) -> list[str]:
    """The names among ``names`` the session's role cannot execute (no such function counts)."""
    names = list(names)
    rows = conn.execute(
        "SELECT p.proname, bool_or(has_function_privilege(p.oid, 'EXECUTE'))"
        " FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'pepsi' AND p.proname = ANY(%s) GROUP BY p.proname",
        (names,),
    ).fetchall()
    allowed = {name for name, ok in rows if ok}
    return [n for n in names if n not in allowed]


MIGRATE_HINT = "run 'pepsi-queue migrate'"


def _has_pepsi_schema(conn) -> bool:
    return conn.execute("SELECT to_regnamespace('pepsi') IS NOT NULL").fetchone()[0]


def database_checks(
    dsn: str, head: str | None, connect: Callable[[str], object] | None = None
) -> list[Check]:
    """Reachable, schema at ``head``, and the role's grants for dispatching."""
    import psycopg

    out: list[Check] = []
    try:
        conn = psycopg.connect(dsn, autocommit=True, application_name="pepsi-dispatch --check")
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split())
        return [Check("database", False, f"cannot connect: {reason}")]
    with conn:
        user, db = conn.execute("SELECT current_user, current_database()").fetchone()
        out.append(Check("database", True, f"connected to {db} as {user}"))
        out.append(session_check(conn, dsn))
        from pepsi_dispatch.schema.migrate import current_revision

        try:
            current = current_revision(conn)
        except psycopg.errors.InsufficientPrivilege as exc:
            reason = exc.diag.message_primary or str(exc)
            current = None
            out.append(Check("schema", False, f"cannot read its version as {user}: {reason}"))
        else:
            if current is None:
                out.append(Check("schema", False, f"{db} is not migrated; {MIGRATE_HINT}"))
            elif head is not None and current != head:
                out.append(
                    Check(
                        "schema",
                        False,
                        f"{db} is at revision {current}, this pepsi-dispatch needs {head};"
                        f" {MIGRATE_HINT}",
                    )
                )
            else:
                out.append(Check("schema", True, f"at revision {current} (head)"))
        if current is None and not _has_pepsi_schema(conn):
            return out
        (usage,) = conn.execute("SELECT has_schema_privilege('pepsi', 'USAGE')").fetchone()
        missing = _function_grants(conn, DISPATCHER_FUNCTIONS)
        if not usage or missing:
            what = ["USAGE on schema pepsi"] if not usage else []
            what += [f"EXECUTE on pepsi.{n}" for n in missing]
            out.append(
                Check(
                    "grants",
                    False,
                    f"role {user} lacks {', '.join(what)};"
                    f" GRANT pepsi_dispatcher TO {user} (as the schema owner)",
                )
            )
        else:
            out.append(Check("grants", True, f"role {user} may dispatch"))
    return out


#: What to do when the dispatcher's DSN reaches PostgreSQL through a pooler
#: that does not keep a session per client.
SESSION_HINT = (
    "give the dispatcher a DSN that reaches PostgreSQL directly (or a pooler in"
    " session mode): [database] DSN / PEPSI_DSN; workers may use the pooler"
    " through WORKER_DSN"
)


def session_check(conn, dsn: str) -> Check:
    """Does the dispatcher's DSN give it a PostgreSQL session of its own? It needs
    one: LISTEN, and session advisory locks held from one transaction to the next.
    ``conn`` is an idle autocommit connection made with ``dsn``."""
    import psycopg

    if not behind_pooler(conn):
        return Check("session", True, "a PostgreSQL session of its own (no pooler in between)")
    try:
        other = psycopg.connect(dsn, autocommit=True, application_name="pepsi-dispatch --check")
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split())
        return Check(
            "session",
            True,
            f"through a connection pooler whose mode"
            f" could not be told (a second connection failed: {reason})",
            warn=True,
        )
    with other:
        try:
            shared = any(_sessions_shared(conn, other) for _ in range(3))
            detail = "two of its connections ran statements in one server session"
        except psycopg.Error as exc:
            shared = True
            detail = f"a transaction through it failed ({exc.diag.message_primary or exc})"
    if shared:
        return Check(
            "session",
            False,
            "the dispatcher's DSN goes through a connection pooler in transaction"
            f" (or statement) mode: {detail}, so LISTEN and the dispatcher's session"
            f" locks would not hold; {SESSION_HINT}",
        )
    return Check(
        "session",
        True,
        "through a connection pooler that kept one server session per connection"
        " (session mode): LISTEN and session locks hold",
    )


def _sessions_shared(a, b) -> bool:
    """One probe: does the pooler give connection ``b``, in a transaction, the
    server session that ran ``a``'s last statement, or ``a`` another session
    while ``b`` holds that one? Neither can happen in session mode; in
    transaction mode PgBouncer hands out the session freed last, so the first
    happens at once unless other clients take it in between."""
    (before,) = a.execute("SELECT pg_backend_pid()").fetchone()
    with b.transaction():
        (held,) = b.execute("SELECT pg_backend_pid()").fetchone()
        if held == before:
            return True
        (after,) = a.execute("SELECT pg_backend_pid()").fetchone()
    return after != before


def worker_dsn_checks(config: Config) -> list[Check]:
    """Each distinct WORKER_DSN: reachable, and its role may run stage transitions."""
    import psycopg

    dsns = {}
    for stage in config.stages.values():
        dsn = stage.worker_dsn or config.dispatch.worker_dsn
        if dsn:
            dsns.setdefault(dsn, []).append(stage.name)
    out = []
    for dsn, stages in dsns.items():
        name = f"WORKER_DSN of {', '.join(stages)}"
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                (user,) = conn.execute("SELECT current_user").fetchone()
                missing = _function_grants(conn, STAGE_FUNCTIONS)
                pooled = behind_pooler(conn)
        except psycopg.Error as exc:
            out.append(Check(name, False, f"cannot connect: {' '.join(str(exc).split())}"))
            continue
        if missing:
            out.append(
                Check(
                    name,
                    False,
                    f"role {user} cannot execute {', '.join('pepsi.' + n for n in missing)};"
                    f" GRANT pepsi_stage TO {user}",
                )
            )
        else:
            via = " (through a connection pooler: the SDK prepares no statements)" if pooled else ""
            out.append(Check(name, True, f"role {user} may run stage transitions{via}"))
    return out
