"""``pepsi-queue enqueue``, ``reschedule`` and ``schedules``: putting messages in
and moving them in time.

``enqueue`` takes ``--priority`` (higher runs first within a stage) and
``--key`` (a dedupe key: while a message with that key is pending, running or
paused, its id is printed and nothing is inserted); ``enqueue STAGE -`` passes
the JSON lines of stdin through unparsed with ``enqueue.enqueue_lines`` (a
COPY, or ``pepsi.enqueue_lines``; chunks of one transaction: all or nothing;
``--key-field`` takes each line's key from its payload); ``reschedule`` moves a
waiting message's due time (``pepsi.reschedule``); ``schedules`` lists the
``[schedule-NAME]`` sections with their last and next tick. The group in
cli/queue.py adds these commands; ``obj`` is its context (``conn()``,
``config_path``).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import click
import psycopg

from pepsi_dispatch.cli.messages import DURATION
from pepsi_dispatch.cli.schedules import schedule_rows, schedule_table
from pepsi_dispatch.cli.stages import check_enqueue_stage
from pepsi_dispatch.cli.watch import _json_default

__all__ = ["MESSAGE_ID", "enqueue_command", "reschedule_command", "schedules_command"]

#: Message ids are bigint identity values (from 1).
MESSAGE_ID = click.IntRange(1, 2**63 - 1)


def _prog() -> str:
    ctx = click.get_current_context(silent=True)
    return ctx.find_root().info_name or "pepsi-queue" if ctx else "pepsi-queue"


def _parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"{where} is not JSON: {exc.msg} at column {exc.colno}") from None


def _object(text: str, where: str) -> dict[str, Any]:
    doc = _parse_json(text, where)
    if not isinstance(doc, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
            type(doc), "a number"
        )
        raise click.BadParameter(
            f"{where} must be a JSON object ({{...}}), not {kind}; wrap it, e.g. "
            f'{{"value": {text.strip()[:40]}}}'
        )
    return doc


def _not_before(at: str | None, in_: timedelta | None) -> datetime | None:
    """--at TIME (ISO 8601; no zone = local time) or --in DURATION (10m, '10 min')."""
    if at and in_ is not None:
        raise click.UsageError("--at and --in cannot be combined")
    if in_ is not None:
        return datetime.now(UTC) + in_
    if at is not None:
        try:
            when = datetime.fromisoformat(at.strip())
        except ValueError:
            raise click.BadParameter(
                f"'{at}' is not a time; use ISO 8601, e.g. 2026-12-01T09:30 or"
                " '2026-12-01 09:30:00+01:00'",
                param_hint="--at",
            ) from None
        return when if when.tzinfo else when.astimezone()  # no zone: local time
    return None


class Progress:
    """Long enqueues say how far they are on stderr (at most once a second) and end
    with the count; a short one (one chunk) stays quiet there."""

    def __init__(self, total: int, every: float = 1.0) -> None:
        self.total = total
        self.every = every
        self.shown_at = time.monotonic()
        self.chunks = 0

    def __call__(self, done: int) -> None:
        self.chunks += 1
        now = time.monotonic()
        if done < self.total and now - self.shown_at >= self.every:
            self.shown_at = now
            click.echo(f"{_prog()}: enqueued {done:,} of {self.total:,}", err=True)

    def finish(self, stage: str, enqueued: int) -> None:
        """The closing count: what went in (the database may find fewer blank lines)."""
        if self.chunks > 1:
            click.echo(f"{_prog()}: enqueued {enqueued:,} message(s) at stage {stage}", err=True)


#: The byte order mark some editors and tools put at the start of a UTF-8 file
#: (PowerShell 5's ``Out-File -Encoding utf8``): not part of the first line's
#: JSON, so dropped.
_BOM = "\ufeff"


def _stdin_lines() -> tuple[list[str], int]:
    """The lines of stdin as text, unparsed (the database parses them), and how
    many are not blank (told at C speed when every line starts with ``{``,
    as nearly always, else line by line). A byte order mark before the first
    line is dropped."""
    buffer = getattr(sys.stdin, "buffer", None)  # none: a text stream (tests)
    data = buffer.read() if buffer is not None else sys.stdin.read().encode()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise click.BadParameter(
            f"stdin line {line} is not UTF-8 text (byte {data[exc.start]:#04x});"
            " JSON lines must be UTF-8; nothing was enqueued"
        ) from None
    text = text.removeprefix(_BOM)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if text.count("\n{") + (text[:1] == "{") == len(lines):
        return lines, len(lines)
    from pepsi_dispatch.enqueue import is_blank

    return lines, sum(1 for line in lines if not is_blank(line))


def _line_error(exc: psycopg.Error) -> click.ClickException:
    """A bad line as pepsi.enqueue_lines named it: what, where, how to fix."""
    hint = exc.diag.message_hint or ""
    detail = exc.diag.message_detail or ""
    where = f" ({detail})" if detail and len(detail) <= 100 else ""
    return click.BadParameter(f"stdin {exc.diag.message_primary}{where}; {hint}".rstrip("; "))


def _enqueue_stdin(
    obj: Any,
    stage: str,
    when: datetime | None,
    priority: int,
    key_field: str | None,
    chunk_size: int,
    progress_every: float,
) -> tuple[list[int], Progress]:
    """``enqueue STAGE -``: the lines of stdin through enqueue_lines, one transaction."""
    from pepsi_dispatch.enqueue import enqueue_lines

    lines, total = _stdin_lines()
    report = Progress(total, every=progress_every)
    try:
        ids = enqueue_lines(
            obj.conn(),
            stage,
            lines,
            chunk_size=chunk_size,
            not_before=when,
            priority=priority,
            key_field=key_field,
            progress=report,
        )
    except _LINE_ERRORS as exc:
        if "line " not in (exc.diag.message_primary or ""):
            raise
        raise _line_error(exc) from None
    return ids, report


#: What pepsi.enqueue_lines raises for a line it names: not JSON, a number or
#: a nesting jsonb cannot hold, too large, not an object, a bad key.
_LINE_ERRORS = (
    psycopg.errors.InvalidTextRepresentation,
    psycopg.errors.InvalidParameterValue,
    psycopg.errors.NumericValueOutOfRange,
    psycopg.errors.ProgramLimitExceeded,
    psycopg.errors.StatementTooComplex,
)


def _payloads(payloads: tuple[str, ...]) -> list[Any]:
    """The JSON objects of the arguments (``-``: stdin, one per line); none: ``{}``."""
    docs: list[Any] = []
    for i, text in enumerate(payloads, 1):
        if text == "-":
            for n, line in enumerate(sys.stdin, 1):
                if n == 1:
                    line = line.removeprefix(_BOM)
                if line.strip():
                    docs.append(_object(line, f"stdin line {n}"))
        else:
            docs.append(_object(text, f"argument {i}"))
    return docs if payloads else [{}]


@click.command(
    "enqueue",
    help="Enqueue messages at STAGE: one per JSON object argument, '-' reads JSON lines.",
)
@click.argument("stage")
@click.argument("payloads", nargs=-1, metavar="[JSON ...|-]")
@click.option("-q", "--quiet", is_flag=True, help="Print only the count, not the ids.")
@click.option("--at", "at", metavar="TIME", help="Run no earlier than TIME (ISO 8601).")
@click.option("--in", "in_", type=DURATION, help="Run no earlier than this from now (10m, 1h30m).")
@click.option("--force", is_flag=True, help="Enqueue even at a stage no configuration knows.")
@click.option(
    "--priority",
    type=click.IntRange(-(2**31), 2**31 - 1),
    default=0,
    help="Higher runs first within a stage (default 0; negative allowed).",
)
@click.option(
    "--key",
    "dedupe_key",
    metavar="KEY",
    help="Dedupe key: while a message with KEY is live, print its id and insert nothing.",
)
@click.option(
    "--key-field",
    metavar="FIELD",
    help="With '-': each line's dedupe key is its payload's FIELD (absent or null: none).",
)
@click.option("--chunk-size", type=click.IntRange(1), default=20_000, hidden=True)
@click.option("--progress-every", type=float, default=1.0, hidden=True)
@click.pass_obj
def enqueue_command(
    obj: Any,
    stage: str,
    payloads: tuple[str, ...],
    quiet: bool,
    at: str | None,
    in_: timedelta | None,
    force: bool,
    priority: int,
    dedupe_key: str | None,
    key_field: str | None,
    chunk_size: int,
    progress_every: float,
) -> None:
    from pepsi_dispatch.enqueue import enqueue_many

    when = _not_before(at, in_)
    if key_field is not None and payloads != ("-",):
        raise click.UsageError("--key-field takes keys from JSON lines: give '-' alone")
    if key_field is not None and dedupe_key is not None:
        raise click.UsageError("--key and --key-field cannot be combined")
    if payloads == ("-",) and dedupe_key is None:
        unchecked = not force and not check_enqueue_stage(obj, stage)
        ids, report = _enqueue_stdin(
            obj, stage, when, priority, key_field, chunk_size, progress_every
        )
        _enqueued(stage, ids, report, unchecked, quiet, when)
        return
    docs = _payloads(payloads)
    if dedupe_key is not None and len(docs) != 1:
        raise click.UsageError("--key gives one message a key: enqueue one payload with it")
    if dedupe_key is not None and not dedupe_key.strip():
        raise click.UsageError(
            "--key needs a key (1 to 512 bytes, not only whitespace); leave --key out for none"
        )
    # Unchecked: said after the insert (a bad name fails there first).
    unchecked = not force and not check_enqueue_stage(obj, stage)
    keys = None if dedupe_key is None else [dedupe_key]
    report = Progress(len(docs))
    ids = enqueue_many(
        obj.conn(),
        stage,
        docs,
        not_before=when,
        priority=priority,
        dedupe_keys=keys,
        progress=report,
    )
    _enqueued(stage, ids, report, unchecked, quiet, when)


def _enqueued(
    stage: str,
    ids: list[int],
    report: Progress,
    unchecked: bool,
    quiet: bool,
    when: datetime | None,
) -> None:
    report.finish(stage, len(ids))
    if unchecked:
        click.echo(
            f"{_prog()}: warning: stage {stage!r} not checked: no dispatcher has registered"
            " its stages and no configuration file was found",
            err=True,
        )
    if quiet:
        later = f", not before {when.isoformat(timespec='seconds')}" if when else ""
        click.echo(f"enqueued {len(ids)} message(s) at stage {stage}{later}")
    else:
        click.echo("".join(f"{mid}\n" for mid in ids), nl=False)


@click.command(
    "reschedule", help="Move a waiting (paused or delayed) message's due time; --now runs it now."
)
@click.argument("message_id", metavar="ID", type=MESSAGE_ID)
@click.option("--now", "now_", is_flag=True, help="Due now (the default).")
@click.option("--in", "in_", type=DURATION, help="Due this long from now (10m, 1h30m).")
@click.option("--at", "at", metavar="TIME", help="Due at TIME (ISO 8601; no zone = local).")
@click.pass_obj
def reschedule_command(
    obj: Any, message_id: int, now_: bool, in_: timedelta | None, at: str | None
) -> int:
    if now_ and (in_ or at):
        raise click.UsageError("--now cannot be combined with --in or --at")
    when = _not_before(at, in_)
    try:
        row = obj.conn().execute("SELECT pepsi.reschedule(%s, %s)", (message_id, when)).fetchone()
    except (psycopg.errors.ObjectNotInPrerequisiteState, psycopg.errors.NoDataFound) as exc:
        hint = f" ({exc.diag.message_hint})" if exc.diag.message_hint else ""
        raise click.ClickException(f"{exc.diag.message_primary}{hint}") from None
    due = row[0] if row else None
    click.echo(f"message {message_id} due {due.isoformat(timespec='seconds') if due else 'now'}")
    return 0


@click.command("schedules", help="The [schedule-NAME] sections: stage, ticks, last and next tick.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_obj
def schedules_command(obj: Any, as_json: bool) -> None:
    rows = schedule_rows(obj.conn(), obj.config_path)
    if as_json:
        click.echo(json.dumps(rows, default=_json_default, sort_keys=True))
    else:
        for line in schedule_table(rows):
            click.echo(line)
