"""``serve --check``'s database part: the queries it makes, as the checks they answer.

The dispatcher's connection (reachable, a session of its own, the schema at
head, the role's grants), the overlay's PROGRAMs, and each WORKER_DSN's role.
The checks that need no database (PROGRAMs runnable, files readable) are in
``coordinator/checks.py``; this module holds every statement ``--check`` sends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pepsi_dispatch.config import Config, ConfigError
from pepsi_dispatch.config import load as _config
from pepsi_dispatch.coordinator.checks import Check, overlay_program_problems
from pepsi_dispatch.pooling import behind_pooler

__all__ = [
    "DISPATCHER_FUNCTIONS",
    "STAGE_FUNCTIONS",
    "database_checks",
    "overlay_checks",
    "session_check",
    "worker_dsn_checks",
]

#: What the dispatcher's role executes (database/postgres.py), and what a stage program's
#: role does (SDK).
DISPATCHER_FUNCTIONS = (
    "register_dispatcher",
    "heartbeat",
    "unregister_dispatcher",
    "claim",
    "claim_lines",
    "requeue_due",
    "reset_orphans",
    "replicas_away",
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
    except ConfigError as exc:
        return [Check("database overlay", False, str(exc))]
    problems = overlay_program_problems(config, overlaid)
    return [Check("database overlay", True, p, warn=True) for p in problems]


def _function_access(conn, names: Iterable[str]) -> tuple[list[str], set[str]]:
    """The names among ``names`` the session's role cannot execute (no such
    function counts), and those of them schema pepsi has no function of: one
    catalog query."""
    names = list(names)
    rows = conn.execute(
        "SELECT p.proname, bool_or(has_function_privilege(p.oid, 'EXECUTE'))"
        " FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'pepsi' AND p.proname = ANY(%s) GROUP BY p.proname",
        (names,),
    ).fetchall()
    allowed = {name for name, ok in rows if ok}
    present = {name for name, _ in rows}
    return [n for n in names if n not in allowed], {n for n in names if n not in present}


def _function_grants(conn, names: Iterable[str]) -> list[str]:
    """The names among ``names`` the session's role cannot execute (no such function counts)."""
    return _function_access(conn, names)[0]


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
        out.extend(_grant_checks(conn, user))
    return out


def _grant_checks(conn, user: str) -> list[Check]:
    """May ``user`` dispatch? The functions an older schema lacks are said apart
    (no grant gives them; migrating does), then the grants it lacks."""
    out = []
    (usage,) = conn.execute("SELECT has_schema_privilege('pepsi', 'USAGE')").fetchone()
    missing, absent = _function_access(conn, DISPATCHER_FUNCTIONS)
    if absent:
        names = ", ".join("pepsi." + n for n in sorted(absent))
        out.append(Check("functions", False, f"the schema lacks {names}; {MIGRATE_HINT}"))
        missing = [n for n in missing if n not in absent]
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


def session_problem(dsn: str) -> str | None:
    """``serve``, before it takes the database: why ``dsn`` gives the dispatcher
    no session of its own (a pooler in transaction or statement mode, as
    :func:`session_check` tells), else None. Through such a pooler its lock
    would be taken in a server session it does not keep: a second dispatcher
    would start beside it, and the pooler would hold the lock after both had
    gone. None too when the database cannot be reached now: the start says
    why, and retries."""
    import psycopg

    try:
        with psycopg.connect(
            dsn, autocommit=True, application_name="pepsi-dispatch start check"
        ) as conn:
            check = session_check(conn, dsn)
    except psycopg.Error:
        return None
    return None if check.ok else check.detail


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
