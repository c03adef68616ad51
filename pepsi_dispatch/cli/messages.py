"""``pepsi-queue list``, its filter options, and the history part of ``pepsi-queue show``.

Both read through SQL functions only: ``pepsi.list_messages`` (filters,
newest first, keyset paging on indexes) and ``pepsi.message_history`` (the
recorded attempts of a message plus what its row says now). The filter
options (:func:`filter_options`, :class:`Filter`) are list's and those of
``requeue`` and ``cancel`` on a filter (cli/bulk.py): one set of options,
one meaning, the SQL function's.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import click

from pepsi_dispatch.cli.stages import check_stage_name
from pepsi_dispatch.cli.watch import _json_default

__all__ = [
    "DURATION",
    "MESSAGE_LIST_MAX_ROWS",
    "STATUSES",
    "Filter",
    "filter_options",
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


def _duration(text: str, hint: str) -> timedelta:
    try:
        return DURATION.convert(text, None, None)
    except click.BadParameter as exc:
        raise click.BadParameter(exc.message, param_hint=hint) from None


def _statuses(values: tuple[str, ...], allowed: tuple[str, ...] = STATUSES) -> list[str] | None:
    out: list[str] = []
    for value in values:
        for s in value.split(","):
            s = s.strip().lower()
            if s not in allowed:
                what = "a status" if s not in STATUSES else "a status this command acts on"
                raise click.BadParameter(
                    f"{s!r} is not {what}; one of {', '.join(allowed)}", param_hint="--status"
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


@dataclass(frozen=True)
class Filter:
    """A message filter as the options give it, checked: pepsi.list_messages' arguments."""

    statuses: list[str] | None
    stage: str | None
    older_than: timedelta | None
    where: str | None  # a JSON object's text: the payload contains it
    reason: str | None  # a failure group (a reason as failed --by-reason prints it)
    words: tuple[str, ...]  # the options as given, to say what the filter was

    @classmethod
    def of(cls, obj: Any, options: dict[str, Any], allowed: tuple[str, ...] = STATUSES) -> Filter:
        """The filter of the parsed options (statuses among ``allowed``; the stage known)."""
        statuses = _statuses(options.get("statuses") or (), allowed)
        where = _where(options.get("where"))
        older_text = options.get("older_than")
        older = _duration(older_text, "'--older-than'") if older_text is not None else None
        stage = options.get("stage")
        check_stage_name(obj, stage)
        words: list[str] = []
        for s in statuses or ():
            words += ["--status", s]
        for flag, value in (
            ("--stage", stage),
            ("--older-than", older_text),
            ("--where", where),
            ("--reason", options.get("reason")),
        ):
            if value is not None:
                words += [flag, value]
        return cls(statuses, stage, older, where, options.get("reason"), tuple(words))

    def empty(self) -> bool:
        """True when no option narrows the selection."""
        return not self.words

    def text(self) -> str:
        """The filter as options, quoted for a shell: ``--stage a --older-than 1h``."""
        return shlex.join(self.words)


def filter_options(status_help: str, with_reason: bool = True) -> Callable[[Any], Any]:
    """list's filter options: --status, --stage, --older-than, --where (or
    --payload-contains), and --reason unless ``with_reason`` is false."""
    options = [
        click.option("--status", "statuses", multiple=True, metavar="S", help=status_help),
        click.option("--stage", help="Only this stage."),
        click.option(
            "--older-than",
            metavar="DURATION",
            help="Only messages last updated before, e.g. 10m, 1h30m (in their status that long).",
        ),
        click.option(
            "--where",
            "--payload-contains",
            "where",
            metavar="JSON",
            help="""Payload contains, e.g. '{"customer": 7}'.""",
        ),
    ]
    if with_reason:
        options.append(
            click.option(
                "--reason",
                metavar="R",
                help="Only failed, timed-out and expired messages of the group R"
                " (a reason as failed --by-reason prints it).",
            )
        )

    def apply(f: Any) -> Any:
        for option in reversed(options):
            f = option(f)
        return f

    return apply


@click.command("list", help="Any message, newest first, with filters; pages on indexes.")
@filter_options("Only this status (repeatable, or comma-separated: pending,paused).")
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
    obj: Any, limit: int, before_id: int | None, as_json: bool, **options: Any
) -> None:
    flt = Filter.of(obj, options)
    cur = obj.conn().execute(
        "SELECT * FROM pepsi.list_messages(%s, %s, %s, %s::jsonb, %s, %s, %s)",
        (flt.statuses, flt.stage, flt.older_than, flt.where, before_id, limit, flt.reason),
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
