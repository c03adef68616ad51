"""Schema migrations from the installed package: ``pepsi-queue migrate``.

Drives alembic's own command API with an :class:`alembic.config.Config` built
here, so neither ``alembic.ini`` nor the current directory matters: the
migrations are found by :mod:`pepsi_dispatch.schema.resources` (in the wheel or in the
checkout), and the database is ``PEPSI_DSN`` or the configuration's
``[database] DSN``. ``alembic upgrade head`` in a checkout runs the very same
migrations through ``alembic.ini``.
"""

from __future__ import annotations

import logging
import os
import sys

import click

from pepsi_dispatch.errors import FatalError, UsageError
from pepsi_dispatch.schema.resources import data_root, migrations_dir

__all__ = ["alembic_config", "current_revision", "head_revision", "migrate", "migrate_command"]


def alembic_config(dsn: str | None = None, stdout=None):  # -> alembic.config.Config
    """An alembic Config for our migrations, independent of the working directory."""
    from alembic.config import Config

    cfg = Config(stdout=stdout or sys.stdout)
    cfg.set_main_option("script_location", str(migrations_dir()))
    # The migrations import migrations.sqlfiles: its parent must be on sys.path.
    cfg.set_main_option("prepend_sys_path", str(data_root()))
    cfg.set_main_option("path_separator", "os")
    if dsn is not None:
        cfg.attributes["pepsi_dsn"] = dsn
    return cfg


def head_revision() -> str:
    """The newest revision the installed migrations know."""
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    return ",".join(sorted(heads))


def current_revision(conn) -> str | None:
    """The revision a psycopg connection's database is at (None: not migrated).

    Read through ``pepsi.schema_version()`` (SECURITY DEFINER, every pepsi role
    may call it) where the schema has it, so the dispatcher's and operators'
    roles read what the migrating superuser wrote; before that function
    existed, from ``public.alembic_version`` directly.
    """
    row = conn.execute(
        "SELECT to_regprocedure('pepsi.schema_version()') IS NOT NULL,"
        " to_regclass('public.alembic_version') IS NOT NULL"
    ).fetchone()
    if row and row[0]:
        (version,) = conn.execute("SELECT pepsi.schema_version()").fetchone()
        return version or None
    if not row or not row[1]:
        return None
    rows = conn.execute("SELECT version_num FROM public.alembic_version").fetchall()
    return ",".join(sorted(r[0] for r in rows)) or None


def _is_below(cfg, target: str, current: str) -> bool:
    """True if ``target`` is an ancestor of ``current`` (or base): a downgrade."""
    from alembic.script import ScriptDirectory

    if target == "base":
        return True
    script = ScriptDirectory.from_config(cfg)
    wanted = script.get_revision(target)
    if wanted is None:
        return False
    for rev in script.iterate_revisions(current, "base"):
        if rev.revision == wanted.revision:
            return rev.revision != current
    return False


def migrate(dsn: str, to: str = "head", sql: bool = False, start: str | None = None) -> None:
    """Bring the database to revision ``to`` (upgrade, or downgrade to an older one).

    With ``sql`` nothing is executed: the DDL from ``start`` (default: an empty
    database) to ``to`` is printed (alembic's offline mode) for review.
    """
    import psycopg
    from alembic import command
    from alembic.util import CommandError

    cfg = alembic_config(dsn)
    old = os.environ.get("PEPSI_DSN")
    os.environ["PEPSI_DSN"] = dsn  # migrations/env.py reads it
    try:
        if sql:
            command.upgrade(cfg, f"{start}:{to}" if start else to, sql=True)
            return
        try:
            with psycopg.connect(dsn, autocommit=True, application_name="pepsi-queue") as conn:
                current = current_revision(conn)
        except psycopg.Error as exc:
            reason = " ".join(str(exc).split())
            raise FatalError(f"cannot connect to the database: {reason}") from None
        if current and to != "head" and _is_below(cfg, to, current):
            command.downgrade(cfg, to)
        else:
            command.upgrade(cfg, to)
    except CommandError as exc:
        raise UsageError(f"migrate: {exc}") from None
    finally:
        if old is None:
            os.environ.pop("PEPSI_DSN", None)
        else:
            os.environ["PEPSI_DSN"] = old


@click.command(
    "migrate",
    help="Bring the database schema to the newest revision (or REV) with alembic;"
    " --sql prints the DDL instead of running it.",
)
@click.option(
    "--to",
    "to",
    metavar="REV",
    default="head",
    show_default=True,
    help="Target revision: head, base or a revision id (older: downgrade).",
)
@click.option("--sql", is_flag=True, help="Print the SQL (alembic offline mode); change nothing.")
@click.option(
    "--from",
    "start",
    metavar="REV",
    help="With --sql: the database is at REV already; print only the upgrade from there.",
)
@click.option(
    "--current",
    is_flag=True,
    help="Print the database's revision and this package's head; change nothing.",
)
@click.pass_obj
def migrate_command(obj, to: str, sql: bool, start: str | None, current: bool) -> None:
    from pepsi_dispatch.enqueue import resolve_dsn

    if start and not sql:
        raise click.UsageError("--from needs --sql (a real migrate reads the database's revision)")
    if current:
        if sql or start or to != "head":
            raise click.UsageError("--current cannot be combined with --sql, --from or --to")
        click.echo(_current_line(resolve_dsn(None, obj.config_path)))
        return

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    # Each step ("Running upgrade 0007 -> 0008, ..."), not alembic's other chatter.
    handler.addFilter(lambda record: record.getMessage().startswith("Running "))
    alembic_log = logging.getLogger("alembic")
    alembic_log.addHandler(handler)
    alembic_log.setLevel(logging.INFO)
    try:
        dsn = os.environ.get("PEPSI_DSN") or (
            "postgresql:///pepsi" if sql else resolve_dsn(None, obj.config_path)
        )
        migrate(dsn, to, sql, start)
    finally:
        alembic_log.removeHandler(handler)
    if not sql:
        click.echo(f"schema at {to if to != 'head' else head_revision()}", err=True)


def _current_line(dsn: str) -> str:
    """``0018 (head)``, ``0016 (head: 0018; run 'pepsi-queue migrate')``, ``none ...``."""
    import psycopg

    head = head_revision()
    try:
        with psycopg.connect(dsn, autocommit=True, application_name="pepsi-queue") as conn:
            now = current_revision(conn)
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split())
        raise FatalError(f"cannot read the schema's revision: {reason}") from None
    if now is None:
        return f"none (not migrated; head: {head}; run 'pepsi-queue migrate')"
    if now == head:
        return f"{now} (head)"
    return f"{now} (head: {head}; run 'pepsi-queue migrate')"
