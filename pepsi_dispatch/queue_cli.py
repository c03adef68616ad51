"""``pepsi-queue``: the operator's command line for the work queue.

``pepsi-queue [-c FILE] COMMAND ...``

* ``enqueue STAGE [JSON ...]`` — one message per JSON argument (none: one ``{}``
  message); ``-`` reads JSON documents from stdin, one per line. Prints the ids.
* ``status`` — message counts by stage and status (``pepsi.queue_counts``).
* ``failed [--stage S] [--limit N]`` — failed/timeout/expired rows with their errors
  (``pepsi.failed_messages``).
* ``requeue (--stage S | --id N ... | --all)`` — those rows back to pending
  (``pepsi.requeue_failed``; the old error is kept in ``state.previous_error``).
* ``purge [--status S ...] [--stage S] [--older-than TIME]`` — delete terminal rows
  (default: all four terminal statuses; ``pepsi.purge``).

The database is ``PEPSI_DSN``, else ``[database] DSN`` of the configuration
(``-c FILE``, ``$PEPSI_CONFIG``, ``~/.config/pepsi.conf``, ``/etc/pepsi.conf``).
Exit codes: 0 success, 2 usage/configuration errors, 1 database errors; errors
are one ``pepsi-queue: error: ...`` line on stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import click
import psycopg

from pepsi_dispatch import __version__
from pepsi_dispatch.clirun import config_option, run_click
from pepsi_dispatch.migrate import migrate_command

__all__ = ["PROG", "cli", "main"]

PROG = "pepsi-queue"
STATUSES = ("pending", "running", "paused", "done", "failed", "timeout", "expired")
TERMINAL = ("done", "failed", "timeout", "expired")


class _Ctx:
    def __init__(self, config_path: str | None) -> None:
        self.config_path = config_path
        self._conn: psycopg.Connection | None = None

    def conn(self) -> psycopg.Connection:
        if self._conn is None:
            from pepsi_dispatch.enqueue import resolve_dsn

            dsn = resolve_dsn(None, self.config_path)
            self._conn = psycopg.connect(dsn, autocommit=True, application_name=PROG)
        return self._conn


@click.group(
    name=PROG,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Operate the pepsi work queue: enqueue, status, failed, requeue, purge.",
)
@config_option
@click.version_option(
    __version__, "-v", "--version", prog_name=PROG, message="%(prog)s %(version)s"
)
@click.pass_context
def cli(ctx: click.Context, config_path: str | None) -> None:
    """Global options."""
    ctx.obj = _Ctx(config_path)


def _parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"{where} is not JSON: {exc.msg} at column {exc.colno}") from None


@cli.command(help="Enqueue messages at STAGE: one per JSON argument, '-' reads JSON lines.")
@click.argument("stage")
@click.argument("payloads", nargs=-1, metavar="[JSON ...|-]")
@click.option("-q", "--quiet", is_flag=True, help="Print only the count, not the ids.")
@click.pass_obj
def enqueue(obj: _Ctx, stage: str, payloads: tuple[str, ...], quiet: bool) -> None:
    from pepsi_dispatch.enqueue import enqueue_many

    docs: list[Any] = []
    for i, text in enumerate(payloads, 1):
        if text == "-":
            for n, line in enumerate(sys.stdin, 1):
                if line.strip():
                    docs.append(_parse_json(line, f"stdin line {n}"))
        else:
            docs.append(_parse_json(text, f"argument {i}"))
    if not payloads:
        docs.append({})
    ids = enqueue_many(obj.conn(), stage, docs)
    if quiet:
        click.echo(f"enqueued {len(ids)} message(s) at stage {stage}")
    else:
        for mid in ids:
            click.echo(mid)


@cli.command(help="Message counts by stage and status.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_obj
def status(obj: _Ctx, as_json: bool) -> None:
    rows = obj.conn().execute("SELECT stage, status, count FROM pepsi.queue_counts()").fetchall()
    table: dict[str, dict[str, int]] = {}
    for stage, st, n in rows:
        table.setdefault(stage, {})[st] = int(n)
    if as_json:
        click.echo(json.dumps(table, sort_keys=True))
        return
    if not table:
        click.echo("the queue is empty")
        return
    width = max(5, *(len(s) for s in table))
    click.echo(f"{'stage':<{width}}" + "".join(f" {s:>8}" for s in STATUSES) + f" {'total':>8}")
    totals = dict.fromkeys(STATUSES, 0)
    for stage in sorted(table):
        counts = table[stage]
        for s in STATUSES:
            totals[s] += counts.get(s, 0)
        click.echo(
            f"{stage:<{width}}"
            + "".join(f" {counts.get(s, 0):>8}" for s in STATUSES)
            + f" {sum(counts.values()):>8}"
        )
    click.echo(
        f"{'TOTAL':<{width}}"
        + "".join(f" {totals[s]:>8}" for s in STATUSES)
        + f" {sum(totals.values()):>8}"
    )


@cli.command(help="Failed, timed-out and expired messages with their errors, newest first.")
@click.option("--stage", help="Only this stage.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--payload", "show_payload", is_flag=True, help="Also print each payload.")
@click.pass_obj
def failed(obj: _Ctx, stage: str | None, limit: int, show_payload: bool) -> None:
    rows = (
        obj.conn()
        .execute(
            "SELECT workqueue_id, stage, status, retries, error, updated_at, payload"
            " FROM pepsi.failed_messages(%s, %s)",
            (stage, limit),
        )
        .fetchall()
    )
    if not rows:
        click.echo("no failed messages" + (f" at stage {stage}" if stage else ""))
        return
    for mid, st, status_, retries, error, updated, payload in rows:
        when = updated.strftime("%Y-%m-%d %H:%M:%S")
        click.echo(f"{mid:>10} {st} {status_} retries={retries} {when}  {error}")
        if show_payload:
            click.echo(f"{'':>10} payload {json.dumps(payload, sort_keys=True)}")


@cli.command(help="Put failed/timeout/expired messages back to pending (retries 0).")
@click.option("--stage", help="Every failed message of this stage.")
@click.option("--id", "ids", type=int, multiple=True, help="This message (repeatable).")
@click.option("--all", "all_", is_flag=True, help="Every failed message of every stage.")
@click.pass_obj
def requeue(obj: _Ctx, stage: str | None, ids: tuple[int, ...], all_: bool) -> None:
    if not (stage or ids or all_):
        raise click.UsageError("say which messages: --stage S, --id N (repeatable) or --all")
    if all_ and (stage or ids):
        raise click.UsageError("--all cannot be combined with --stage or --id")
    row = (
        obj.conn()
        .execute("SELECT pepsi.requeue_failed(%s, %s)", (stage, list(ids) if ids else None))
        .fetchone()
    )
    n = int(row[0]) if row else 0
    click.echo(f"requeued {n} message(s)")


@cli.command(help="Delete terminal messages (done, failed, timeout, expired).")
@click.option(
    "--status",
    "statuses",
    type=click.Choice(TERMINAL),
    multiple=True,
    help="Only rows in this status (repeatable; default: all four).",
)
@click.option("--stage", help="Only this stage.")
@click.option("--older-than", metavar="TIME", help="Only rows last changed before, e.g. '7 d'.")
@click.pass_obj
def purge(obj: _Ctx, statuses: tuple[str, ...], stage: str | None, older_than: str | None) -> None:
    from datetime import timedelta

    from pepsi_dispatch.config import parse_time

    age = None
    if older_than is not None:
        try:
            age = timedelta(seconds=parse_time(older_than))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--older-than") from None
    row = (
        obj.conn()
        .execute("SELECT pepsi.purge(%s, %s, %s)", (list(statuses or TERMINAL), stage, age))
        .fetchone()
    )
    n = int(row[0]) if row else 0
    click.echo(f"purged {n} message(s)")


# migrate lives in its own module (alembic is imported only when it runs).
cli.add_command(migrate_command)


def _report(message: str) -> None:
    line = " ".join(message.split())
    print(f"{PROG}: error: {line}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns the exit code (one error line, never a traceback)."""

    def database_error(exc: Exception) -> int:
        if isinstance(exc, psycopg.OperationalError):
            _report(f"cannot reach the database: {exc}")
        elif isinstance(exc, psycopg.Error):
            _report(f"database: {exc.diag.message_primary or exc}")
        else:
            raise exc
        return 1

    args = sys.argv[1:] if argv is None else argv
    return run_click(cli, PROG, args, _report, database_error)


if __name__ == "__main__":
    sys.exit(main())
