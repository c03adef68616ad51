"""``pepsi-queue list`` and the history part of ``pepsi-queue show``.

Both read through SQL functions only: ``pepsi.list_messages`` (filters,
newest first, keyset paging on indexes) and ``pepsi.message_history`` (the
recorded attempts of a message plus what its row says now).
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import click

from pepsi_dispatch.cli.stages import check_stage_name
from pepsi_dispatch.cli.watch import _json_default

__all__ = [
    "DURATION",
    "MESSAGE_LIST_MAX_ROWS",
    "STATUSES",
    "history_lines",
    "list_command",
    "read_history",
]

#: The statuses of pepsi.workqueue (its CHECK constraint), in the order people read them.
STATUSES = ("pending", "running", "paused", "done", "failed", "timeout", "expired")
#: The most rows one call of pepsi.list_messages returns (it refuses more with
#: 22023): ``pepsi-queue list --limit`` and pepsi-httpd's message list stop here.
MESSAGE_LIST_MAX_ROWS = 10000
#: Lines of a traceback shown by ``show`` (its last ones; ``show --json`` has it all).
TRACEBACK_LINES = 12


class _Duration(click.ParamType):
    """A command-line duration: ``90s``, ``10m``, ``1h30m``, ``5 min``, a bare number
    of seconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):
        if isinstance(value, timedelta):
            return value
        from pepsi_dispatch.config import ConfigError, parse_duration

        try:
            return timedelta(seconds=parse_duration(str(value)))
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


DURATION = _Duration()


def _statuses(values: tuple[str, ...]) -> list[str] | None:
    out: list[str] = []
    for value in values:
        for s in value.split(","):
            s = s.strip().lower()
            if s not in STATUSES:
                raise click.BadParameter(
                    f"{s!r} is not a status; one of {', '.join(STATUSES)}", param_hint="--status"
                )
            out.append(s)
    return out or None


def _where(text: str | None) -> str | None:
    if text is None:
        return None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc.msg}", param_hint="--where") from None
    if not isinstance(doc, dict):
        raise click.BadParameter(
            "a JSON object the payload contains, e.g. '{\"customer\": 7}'", param_hint="--where"
        )
    return json.dumps(doc)


@click.command("list", help="Any message, newest first, with filters; pages on indexes.")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    metavar="S",
    help="Only this status (repeatable, or comma-separated: pending,paused).",
)
@click.option("--stage", help="Only this stage.")
@click.option(
    "--older-than",
    type=DURATION,
    help="Only messages last updated before, e.g. 10m, 1h30m (in their status that long).",
)
@click.option(
    "--where", "where", metavar="JSON", help="""Payload contains, e.g. '{"customer": 7}'."""
)
@click.option(
    "--limit", type=click.IntRange(1, MESSAGE_LIST_MAX_ROWS), default=50, show_default=True
)
@click.option(
    "--before",
    "before_id",
    type=click.IntRange(min=1),
    metavar="ID",
    help="The next page: ids below ID (the last id of the previous page).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array instead of a table.")
@click.pass_obj
def list_command(
    obj: Any,
    statuses: tuple[str, ...],
    stage: str | None,
    older_than: timedelta | None,
    where: str | None,
    limit: int,
    before_id: int | None,
    as_json: bool,
) -> None:
    wanted = _statuses(statuses)
    contains = _where(where)
    check_stage_name(obj, stage)
    cur = obj.conn().execute(
        "SELECT * FROM pepsi.list_messages(%s, %s, %s, %s::jsonb, %s, %s)",
        (wanted, stage, older_than, contains, before_id, limit),
    )
    names = [c.name for c in cur.description or ()]
    rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    if as_json:
        click.echo(json.dumps(rows, default=_json_default, sort_keys=True))
        return
    if not rows:
        click.echo("no messages match")
        return
    _print_table(rows)
    if len(rows) == limit:
        click.echo(f"(more: add --before {rows[-1]['workqueue_id']} for the next page)", err=True)


def _print_table(rows: list[dict[str, Any]]) -> None:
    width = max(5, *(len(r["stage"]) for r in rows))
    click.echo(
        f"{'workqueue_id':>12}  {'stage':<{width}}  {'status':<8} {'retries':>7}"
        f"  {'created':<19}  reason"
    )
    for r in rows:
        note = r["reason"] or ""
        if r["due"] is not None:
            note = f"due {r['due'].strftime('%Y-%m-%d %H:%M:%S')}" + (f"; {note}" if note else "")
        click.echo(
            f"{r['workqueue_id']:>12}  {r['stage']:<{width}}  {r['status']:<8} {r['retries']:>7}"
            f"  {r['created_at'].strftime('%Y-%m-%d %H:%M:%S')}  {' '.join(note.split())[:120]}"
        )


def read_history(conn: Any, message_id: int) -> list[dict[str, Any]]:
    """The rows of ``pepsi.message_history`` as dicts, oldest first."""
    cur = conn.execute("SELECT * FROM pepsi.message_history(%s)", (message_id,))
    names = [c.name for c in cur.description or ()]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def history_lines(history: list[dict[str, Any]]) -> list[str]:
    """``show``'s history section: one line per attempt, a traceback's last lines under it."""
    if not history:
        return ["  history     none recorded"]
    lines = ["  history     (failures, pauses and releases; the last 20 are kept)"]

    def when(t: Any) -> str:
        return t.strftime("%H:%M:%S") if t is not None else "-"

    for h in history:
        number = f"{h['attempt']:>3}" if h["attempt"] is not None else "  -"
        reason = " ".join((h["reason"] or "").split())
        day = next((t for t in (h["started_at"], h["ended_at"]) if t is not None), None)
        date = day.strftime("%Y-%m-%d") if day is not None else " " * 10
        lines.append(
            f"    {number}  {date} {when(h['started_at'])} → {when(h['ended_at'])}"
            f"  {h['stage']:<12} {h['outcome']:<9} {reason}".rstrip()
        )
        if h["traceback"]:
            tb = h["traceback"].rstrip("\n").split("\n")
            if len(tb) > TRACEBACK_LINES:
                lines.append(f"           … {len(tb) - TRACEBACK_LINES} line(s), see show --json")
            lines.extend(f"           | {t}" for t in tb[-TRACEBACK_LINES:])
    return lines
