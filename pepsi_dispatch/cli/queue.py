"""``pepsi-queue``: the operator's command line for the work queue.

``pepsi-queue [-c FILE] COMMAND ...``

* ``enqueue STAGE [JSON ...] [--at TIME | --in TIME] [--force]`` — one message per
  JSON object argument (none: one ``{}`` message); ``-`` reads JSON objects from
  stdin, one per line. Prints the ids. A stage that neither the dispatcher's
  registered stage table nor the configuration file knows is refused (``--force``).
* ``status [--json] [--watch [--interval S] [--count N]]`` — message counts by stage
  and status; ``--watch``: rates, oldest pending wait, live workers, refreshed in place.
* ``list [FILTER] [--limit N] [--before ID] [--json]`` — any message, newest
  first, paged on indexes. FILTER: ``--status S`` (repeatable), ``--stage X``,
  ``--older-than D``, ``--where JSON`` (or ``--payload-contains``), ``--reason R``.
* ``show ID [--json]`` — one message: row, state, errors, retries against
  MAX_RETRIES, ages, and its history (failures, pauses, releases, tracebacks).
* ``failed [--stage S] [--limit N] [--json | --by-reason | --reason R]`` —
  failed/timeout/expired rows with their errors, or those grouped by a
  normalised reason (numbers, ids and hex masked), or one such group's rows.
* ``requeue (FILTER | --all) [--yes | --dry-run]`` / ``requeue --id N ... [--stage S]``
  — failed/timeout/expired rows back to pending (``pepsi.requeue_matching``, which
  moves them through ``pepsi.requeue_failed``: the old error is kept in
  ``state.previous_error``, dedupe keys are respected).
* ``cancel (FILTER | --all) [--yes | --dry-run]`` / ``cancel --id N ... [--stage S]`` —
  pending/paused rows to failed ('cancelled by operator'); FILTER without ``--reason``.
* On a filter or ``--all`` they count first, print ``would requeue N message(s)
  matching …`` and ask (cli/bulk.py); ``--yes`` does not ask, ``--dry-run`` only
  counts, and one of them is required when stdin is not a terminal.
* With ``--id``, ``requeue`` and ``cancel`` act on each id on its own (cli/byid.py):
  stdout names the ids acted on, and each other id gets one error line saying why.
* ``purge [--status S ...] [--stage S] [--older-than TIME] [--yes] [--dry-run]`` —
  delete terminal rows; without a selection it refuses unless ``--yes``.
* ``pause STAGE`` / ``resume STAGE`` — claim nothing more for a stage (its rows
  stay where they are) / let it run again; ``resume`` also ends the stage's
  hold-off at once (cli/pausing.py).

Every command goes through ``pepsi.*`` functions, never table SQL. The role
for people is ``pepsi_operator``; an error for a missing privilege says so.
Durations (``--in``, ``--older-than``, ``--interval``) are ``90s``, ``10m``,
``1h30m`` or the configuration's ``5 min``. A ``--stage`` nobody knows is
refused with the closest known name.

The database is ``PEPSI_DSN``, else ``[database] DSN`` of the configuration
(``-c FILE``, ``$PEPSI_CONFIG``, ``~/.config/pepsi.conf``, ``/etc/pepsi.conf``).
Exit codes: 0 success, 2 usage/configuration errors (a bad payload, an unknown
stage, purge without a selection, requeue/cancel on a filter from a script
without --yes or --dry-run), 1 database errors, a bulk action declined at its
prompt, and unknown message ids
(``show``, and ``cancel``/``requeue --id`` of ids they could not act on, each
named with why; the ids they did act on are never reported as errors);
errors are one ``pepsi-queue: error: ...`` line on stderr. Without a command it
prints its help.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import click
import psycopg

from pepsi_dispatch.cli.bulk import (
    CANCEL_MATCHING,
    REQUEUE_MATCHING,
    Bulk,
    bulk_options,
    check_selection,
    run_bulk,
)
from pepsi_dispatch.cli.byid import CANCEL, REQUEUE, Action, act_on_ids, summary
from pepsi_dispatch.cli.messages import (
    DURATION,
    STATUSES,
    Filter,
    filter_options,
    history_lines,
    list_command,
    read_history,
)
from pepsi_dispatch.cli.pausing import pause_command, resume_command
from pepsi_dispatch.cli.produce import (
    MESSAGE_ID,
    enqueue_command,
    reschedule_command,
    schedules_command,
)
from pepsi_dispatch.cli.shell import config_option, run_click, version_option
from pepsi_dispatch.cli.stages import check_stage_name
from pepsi_dispatch.cli.watch import NO_LIVE_DISPATCHER, _age, _json_default, watch_status
from pepsi_dispatch.schema.migrate import migrate_command

__all__ = ["PROG", "cli", "main", "run"]

PROG = "pepsi-queue"
TERMINAL = ("done", "failed", "timeout", "expired")


#: The login role of this run's connection, for the error that names the role to grant.
_session: dict[str, str] = {}


class _Ctx:
    def __init__(self, config_path: str | None) -> None:
        self.config_path = config_path
        self._conn: psycopg.Connection | None = None

    def conn(self) -> psycopg.Connection:
        if self._conn is None:
            from pepsi_dispatch.enqueue import resolve_dsn

            dsn = resolve_dsn(None, self.config_path)
            self._conn = psycopg.connect(dsn, autocommit=True, application_name=PROG)
            _session["user"] = self._conn.info.user
        return self._conn

    def close(self) -> None:
        """End the session, if one was opened (the command is over)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@click.group(
    name=PROG,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Operate the pepsi work queue: enqueue, status, list, show, failed, requeue, cancel,"
    " purge, pause, resume, reschedule, schedules, migrate.",
)
@config_option
@version_option(PROG)
@click.pass_context
def cli(ctx: click.Context, config_path: str | None) -> None:
    """Global options."""
    ctx.obj = _Ctx(config_path)
    ctx.call_on_close(ctx.obj.close)


@cli.command(help="Message counts by stage and status; --watch for a live view.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--watch",
    is_flag=True,
    help="Rates, oldest pending wait and workers per stage, refreshed in place (Ctrl-C ends).",
)
@click.option(
    "--interval",
    type=DURATION,
    default="2s",
    show_default=True,
    help="Time between refreshes of --watch (2s, 500ms, 1m).",
)
@click.option("--count", type=click.IntRange(min=1), help="Stop --watch after this many refreshes.")
@click.pass_obj
def status(obj: _Ctx, as_json: bool, watch: bool, interval: timedelta, count: int | None) -> None:
    if watch:
        if interval.total_seconds() < 0.1:
            raise click.BadParameter("at least 0.1 s", param_hint="--interval")
        watch_status(obj, interval.total_seconds(), count, as_json)
        return
    conn = obj.conn()
    cur = conn.execute(
        "SELECT stage, pending, running, paused, done, failed, timeout, expired"
        " FROM pepsi.queue_overview()"
    )
    table = {r[0]: dict(zip(STATUSES, (int(n) for n in r[1:]), strict=True)) for r in cur}
    health = _stage_health(conn)
    if as_json:
        for stage, counts in table.items():
            counts["health"] = health.get(stage, {"state": "unknown"})  # type: ignore[assignment]
        click.echo(json.dumps(table, sort_keys=True))
        return
    if not table:
        click.echo("the queue is empty")
    else:
        _status_table(table, health)
    _say_dispatchers(obj)


def _stage_health(conn: psycopg.Connection) -> dict[str, dict[str, Any]]:
    """pepsi.stage_health() by stage (state, cause, since as epoch, held_seconds)."""
    rows = conn.execute(
        "SELECT stage, state, cause, extract(epoch FROM since)::float8, held_seconds"
        " FROM pepsi.stage_health()"
    ).fetchall()
    keys = ("state", "cause", "since", "held_seconds")
    return {r[0]: {k: v for k, v in zip(keys, r[1:], strict=True) if v is not None} for r in rows}


def _health_text(h: dict[str, Any]) -> str:
    state = h.get("state", "unknown")
    if state in ("held_off", "no_worker"):
        return f"{'held off' if state == 'held_off' else 'NO WORKER'} {_seconds(h)}"
    return state


def _seconds(h: dict[str, Any]) -> str:
    s = float(h.get("held_seconds") or 0.0)
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min"


def _status_table(table: dict[str, dict[str, int]], health: dict[str, dict[str, Any]]) -> None:
    width = max(5, *(len(s) for s in table))
    click.echo(
        f"{'stage':<{width}}" + "".join(f" {s:>8}" for s in STATUSES) + f" {'total':>8}  health"
    )
    totals = dict.fromkeys(STATUSES, 0)
    for stage in sorted(table):
        counts = table[stage]
        for s in STATUSES:
            totals[s] += counts.get(s, 0)
        click.echo(
            f"{stage:<{width}}"
            + "".join(f" {counts.get(s, 0):>8}" for s in STATUSES)
            + f" {sum(counts.values()):>8}  {_health_text(health.get(stage, {}))}"
        )
    click.echo(
        f"{'TOTAL':<{width}}"
        + "".join(f" {totals[s]:>8}" for s in STATUSES)
        + f" {sum(totals.values()):>8}"
    )
    for stage in sorted(health):
        h = health[stage]
        if h.get("state") in ("held_off", "no_worker"):
            since = datetime.fromtimestamp(h["since"], UTC).strftime("%Y-%m-%d %H:%M:%S")
            what = "held off" if h["state"] == "held_off" else "held off, no worker running"
            click.echo(
                f"stage {stage}: {what} since {since} UTC ({_seconds(h)}):"
                f" {h.get('cause') or 'cause unknown'}"
            )


def _say_dispatchers(obj: _Ctx) -> None:
    """One line: how many dispatchers are live (by session), or plainly that none is."""
    try:
        rows = obj.conn().execute("SELECT live FROM pepsi.queue_dispatchers()").fetchall()
    except psycopg.errors.InsufficientPrivilege:
        return  # a role that may not see the dispatchers: the counts alone
    live = sum(1 for (is_live,) in rows if is_live)
    if live:
        click.echo(f"dispatchers: {live} live of {len(rows)} registered")
    else:
        click.echo(NO_LIVE_DISPATCHER)


@cli.command(help="Failed, timed-out and expired messages with their errors, newest first.")
@click.option("--stage", help="Only this stage.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--payload", "show_payload", is_flag=True, help="Also print each payload.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one array) instead of lines.")
@click.option(
    "--by-reason",
    is_flag=True,
    help="Group by stage, status and normalised reason (numbers, ids, hex masked).",
)
@click.option(
    "--reason",
    metavar="R",
    help="Only the group R (a reason as --by-reason prints it), with each raw reason.",
)
@click.pass_obj
def failed(
    obj: _Ctx,
    stage: str | None,
    limit: int,
    show_payload: bool,
    as_json: bool,
    by_reason: bool,
    reason: str | None,
) -> None:
    check_stage_name(obj, stage)
    if by_reason:
        _failed_by_reason(obj, stage, limit, as_json)
        return
    rows = (
        obj.conn()
        .execute(
            "SELECT workqueue_id, stage, status, retries, error, updated_at, payload"
            " FROM pepsi.failed_messages(%s, %s, %s)",
            (stage, limit, reason),
        )
        .fetchall()
    )
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "id": mid,
                        "stage": st,
                        "status": status_,
                        "retries": retries,
                        "error": error,
                        "updated_at": updated.isoformat(),
                        "payload": payload,
                    }
                    for mid, st, status_, retries, error, updated, payload in rows
                ]
            )
        )
        return
    if not rows:
        click.echo(
            "no failed messages"
            + (f" at stage {stage}" if stage else "")
            + (f" with reason {reason!r}" if reason else "")
        )
        return
    for mid, st, status_, retries, error, updated, payload in rows:
        when = updated.strftime("%Y-%m-%d %H:%M:%S")
        click.echo(f"{mid:>10} {st} {status_} retries={retries} {when}  {error}")
        if show_payload:
            click.echo(f"{'':>10} payload {json.dumps(payload, sort_keys=True)}")


@cli.command(
    help="Put failed, timed-out and expired messages back to pending (retries 0): the --id"
    " ones, or every one a filter (list's options) or --all selects, counted and confirmed first."
)
@click.option(
    "--id", "ids", type=MESSAGE_ID, multiple=True, help="This message (repeatable; one by one)."
)
@click.option("--all", "all_", is_flag=True, help="Every failed, timed-out and expired message.")
@filter_options("Only this status: failed, timeout or expired (repeatable, or comma-separated).")
@bulk_options
@click.pass_obj
def requeue(
    obj: _Ctx, ids: tuple[int, ...], all_: bool, yes: bool, dry_run: bool, **options: Any
) -> int:
    return _act(obj, REQUEUE, REQUEUE_MATCHING, (ids, all_, yes, dry_run), options)


@cli.command(
    help="Put pending and paused messages to failed ('cancelled by operator'): the --id ones,"
    " or every one a filter (list's options) or --all selects, counted and confirmed first."
)
@click.option(
    "--id", "ids", type=MESSAGE_ID, multiple=True, help="This message (repeatable; one by one)."
)
@click.option("--all", "all_", is_flag=True, help="Every pending and paused message.")
@filter_options("Only this status: pending or paused (repeatable, or comma-separated).", False)
@bulk_options
@click.pass_obj
def cancel(
    obj: _Ctx, ids: tuple[int, ...], all_: bool, yes: bool, dry_run: bool, **options: Any
) -> int:
    return _act(obj, CANCEL, CANCEL_MATCHING, (ids, all_, yes, dry_run), options)


def _act(
    obj: _Ctx,
    action: Action,
    bulk: Bulk,
    how: tuple[tuple[int, ...], bool, bool, bool],
    options: dict[str, Any],
) -> int:
    """requeue/cancel: by id (one call each, cli/byid.py) or on a filter (cli/bulk.py)."""
    ids, all_, yes, dry_run = how
    flt = Filter.of(obj, options, bulk.statuses)
    check_selection(bulk, ids, all_, flt, dry_run)
    if ids:
        return _by_id(obj, action, ids, flt.stage)
    return run_bulk(obj.conn(), bulk, flt, yes, dry_run)


def _by_id(obj: _Ctx, action: Action, ids: tuple[int, ...], stage: str | None) -> int:
    """``--id``: the ids acted on (stdout), one error line per other id; 1 if any."""
    outcome = act_on_ids(obj.conn(), action, ids, stage)
    click.echo(summary(action, outcome.done))
    for line in outcome.refused:
        _report(line)
    return 1 if outcome.refused else 0


@cli.command(help="Delete terminal messages (done, failed, timeout, expired).")
@click.option(
    "--status",
    "statuses",
    type=click.Choice(TERMINAL),
    multiple=True,
    help="Only rows in this status (repeatable; default: all four).",
)
@click.option("--stage", help="Only this stage.")
@click.option(
    "--older-than", type=DURATION, help="Only rows last changed before, e.g. 7d, 12h, '7 d'."
)
@click.option("--yes", is_flag=True, help="Without --status/--stage/--older-than: delete them all.")
@click.option("--dry-run", is_flag=True, help="Only count what would be deleted.")
@click.pass_obj
def purge(
    obj: _Ctx,
    statuses: tuple[str, ...],
    stage: str | None,
    older_than: timedelta | None,
    yes: bool,
    dry_run: bool,
) -> None:
    age = older_than
    if not (statuses or stage or older_than is not None or yes or dry_run):
        raise click.UsageError(
            "purge deletes every done, failed, timeout and expired message unless you select"
            " some: --status S, --stage S, --older-than TIME; --yes to delete them all,"
            " --dry-run to count them"
        )
    row = (
        obj.conn()
        .execute(
            "SELECT pepsi.purge(%s, %s, %s, %s)",
            (list(statuses or TERMINAL), stage, age, dry_run),
        )
        .fetchone()
    )
    n = int(row[0]) if row else 0
    click.echo(f"would purge {n} message(s)" if dry_run else f"purged {n} message(s)")


@cli.command(help="One message: row, state, errors, retries of MAX_RETRIES, ages, history.")
@click.argument("message_id", metavar="ID", type=MESSAGE_ID)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.pass_obj
def show(obj: _Ctx, message_id: int, as_json: bool) -> int:
    cur = obj.conn().execute("SELECT * FROM pepsi.message_story(%s)", (message_id,))
    row = cur.fetchone()
    if row is None:
        _report(f"no message {message_id}")
        return 1
    story = dict(zip([c.name for c in cur.description or ()], row, strict=True))
    history = read_history(obj.conn(), message_id)
    if as_json:
        story["history"] = history
        click.echo(json.dumps(story, default=_json_default, sort_keys=True))
        return 0
    for line in _story_lines(story) + history_lines(history):
        click.echo(line)
    return 0


def _story_lines(m: dict[str, Any]) -> list[str]:
    when = "%Y-%m-%d %H:%M:%S %Z"
    cap = m["max_retries"]
    lines = [
        f"message {m['workqueue_id']}",
        f"  stage       {m['stage']}"
        + ("" if m["stage_registered"] else "  (not a registered stage)"),
        f"  status      {m['status']}"
        + ("  (delayed: enqueued with a later not_before)" if m["delayed"] else ""),
        f"  retries     {m['retries']}"
        + (f" of {cap} (MAX_RETRIES; counted at this stage)" if cap is not None else ""),
        f"  created     {m['created_at'].strftime(when)}  ({_age(m['age'])} ago)",
        f"  updated     {m['updated_at'].strftime(when)}  ({_age(m['since_update'])} ago)",
    ]
    if m.get("priority"):
        lines.append(f"  priority    {m['priority']}")
    if m.get("dedupe_key") is not None:
        lines.append(f"  dedupe key  {m['dedupe_key']}")
    if m["status"] == "paused" and m["timeout"] is not None:
        lines.append(f"  due         {m['timeout']}  (in {_age(m['due_in'])})")
    if m["dispatcher_id"] is not None:
        lines.append(f"  held by     dispatcher {m['dispatcher_id']}")
    by = (m["state"] or {}).get("scheduled_by")
    if by is not None:
        lines.append(f"  scheduled   by [schedule-{by}], tick {m['state'].get('scheduled_for')}")
    if m["error"]:
        lines.append(f"  error       {m['error']}")
    for key, value in (m["errors"] or {}).items():
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        lines.append(f"    {key}: {text}")
    lines.append(f"  payload     {json.dumps(m['payload'], sort_keys=True)}")
    lines.append(f"  state       {json.dumps(m['state'], sort_keys=True)}")
    return lines


def _failed_by_reason(obj: _Ctx, stage: str | None, limit: int, as_json: bool) -> None:
    cur = obj.conn().execute(
        "SELECT stage, status, reason, count, oldest, newest, ids, examples"
        " FROM pepsi.failed_reasons(%s)",
        (stage,),
    )
    rows = cur.fetchall()[:limit]
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "stage": st,
                        "status": status_,
                        "reason": reason,
                        "count": n,
                        "oldest": oldest.isoformat(),
                        "newest": newest.isoformat(),
                        "ids": ids,
                        "examples": examples,
                    }
                    for st, status_, reason, n, oldest, newest, ids, examples in rows
                ]
            )
        )
        return
    if not rows:
        click.echo("no failed messages" + (f" at stage {stage}" if stage else ""))
        return
    click.echo(f"{'count':>7}  {'stage':<12} {'status':<8} reason  (newest ids)")
    for st, status_, reason, n, _oldest, _newest, ids, examples in rows:
        click.echo(f"{n:>7}  {st:<12} {status_:<8} {reason}  ({', '.join(map(str, ids))})")
        if examples and examples != [reason]:
            click.echo(f"{'':>9}e.g. {examples[0]}")
    click.echo("(one group's messages and raw reasons: failed --reason 'REASON')", err=True)


# migrate lives in its own module (alembic is imported only when it runs); list too.
cli.add_command(migrate_command)
cli.add_command(list_command)
# Putting messages in and moving them: cli/produce.py.
for _command in (enqueue_command, reschedule_command, schedules_command):
    cli.add_command(_command)
# Pausing and resuming a stage: cli/pausing.py.
cli.add_command(pause_command)
cli.add_command(resume_command)


def _report(message: str) -> None:
    line = " ".join(message.split())
    print(f"{PROG}: error: {line}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns the exit code (one error line, never a traceback)."""

    def database_error(exc: Exception) -> int:
        if isinstance(exc, psycopg.errors.InsufficientPrivilege):
            user = _session.get("user", "your login role")
            _report(
                f"database: {exc.diag.message_primary or exc}; role {user} lacks the privilege:"
                f" GRANT pepsi_operator TO {user} (as the schema owner) for pepsi-queue"
            )
        elif isinstance(exc, psycopg.errors.UndefinedFunction | psycopg.errors.InvalidSchemaName):
            _report(
                f"database: {exc.diag.message_primary or exc}; the schema is missing or older"
                " than this pepsi-queue: run 'pepsi-queue migrate'"
            )
        elif isinstance(exc, psycopg.OperationalError):
            _report(f"cannot reach the database: {exc}")
        elif isinstance(exc, psycopg.Error):
            hint = f"; {exc.diag.message_hint}" if exc.diag.message_hint else ""
            _report(f"database: {exc.diag.message_primary or exc}{hint}")
        else:
            raise exc
        return 1

    args = sys.argv[1:] if argv is None else argv
    if not args:
        # A bare pepsi-queue: the normal help, not a usage error squashed into one line.
        with click.Context(cli, info_name=PROG, **cli.context_settings) as ctx:
            click.echo(cli.get_help(ctx))
        return 0
    return run_click(cli, PROG, args, _report, database_error)


def run() -> None:
    """The console script: :func:`main`, then the process ends without the
    interpreter's teardown of every module (some 30 ms of a command's run).
    The session is closed and stdout and stderr are flushed first; when they
    cannot be (a reader that went away), the usual exit says so."""
    status = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(status)
    os._exit(status)


if __name__ == "__main__":
    run()
