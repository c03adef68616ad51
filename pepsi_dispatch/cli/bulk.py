"""``pepsi-queue requeue`` / ``cancel`` on a filter: count, confirm, then act in one call.

The selection is list's filter (cli/messages.py: ``--status``, ``--stage``,
``--older-than``, ``--where``, ``--reason``) or ``--all``. The command first
counts what it selects among the statuses the action acts on
(``pepsi.requeue_matching`` / ``pepsi.cancel_matching`` with ``dry_run``),
prints ``would requeue N message(s) matching …`` and asks. ``--yes`` acts
without asking, ``--dry-run`` stops after the count, and when stdin is not a
terminal one of the two is required (nobody could answer). Then one call acts
on the whole filter, bounded by the newest id counted, so messages that
arrived after the count are left alone. ``--id`` (cli/byid.py) stays one
call per id, to name each id acted on.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import click
import psycopg

from pepsi_dispatch.cli.messages import Filter

__all__ = [
    "CANCEL_MATCHING",
    "REQUEUE_MATCHING",
    "Bulk",
    "bulk_options",
    "check_selection",
    "run_bulk",
]


@dataclass(frozen=True)
class Bulk:
    """One action on a filter: its words, its SQL call and the statuses it acts on."""

    verb: str  # "requeue"
    past: str  # "requeued"
    sql: str  # named parameters: statuses, in_stage, older_than, where, reason, before, dry_run
    statuses: tuple[str, ...]
    filters: str  # the filter options it takes, for the usage error
    kept: str  # why a selected message may stay where it is

    @property
    def which(self) -> str:
        """Its statuses as a sentence says them: ``failed, timeout or expired``."""
        return ", ".join(self.statuses[:-1]) + " or " + self.statuses[-1]


REQUEUE_MATCHING = Bulk(
    "requeue",
    "requeued",
    "SELECT matched, acted, newest_id FROM pepsi.requeue_matching(statuses => %(statuses)s,"
    " in_stage => %(in_stage)s, older_than => %(older_than)s,"
    " payload_contains => %(where)s::jsonb, reason_group => %(reason)s,"
    " before_id => %(before)s, dry_run => %(dry_run)s)",
    ("failed", "timeout", "expired"),
    "--stage, --status, --older-than, --where, --reason",
    "a pending, running or paused message carries their dedupe key, or they changed meanwhile",
)
CANCEL_MATCHING = Bulk(
    "cancel",
    "cancelled",
    "SELECT matched, acted, newest_id FROM pepsi.cancel_matching(statuses => %(statuses)s,"
    " in_stage => %(in_stage)s, older_than => %(older_than)s,"
    " payload_contains => %(where)s::jsonb, before_id => %(before)s, dry_run => %(dry_run)s)",
    ("pending", "paused"),
    "--stage, --status, --older-than, --where",
    "a worker claimed them meanwhile",
)


def bulk_options(f: object) -> object:
    """``--yes`` and ``--dry-run`` of an action on a filter."""
    f = click.option(
        "--dry-run",
        is_flag=True,
        help="With a filter or --all: only count the messages it would act on.",
    )(f)
    return click.option(
        "--yes",
        is_flag=True,
        help="With a filter or --all: act without asking (required when stdin is not a terminal).",
    )(f)


def check_selection(
    bulk: Bulk, ids: tuple[int, ...], all_: bool, flt: Filter, dry_run: bool
) -> None:
    """A usage error unless exactly one kind of selection is given: ids (with at most
    --stage), a filter, or --all."""
    if not (ids or all_ or not flt.empty()):
        raise click.UsageError(
            f"say which messages: --id N (repeatable), a filter ({bulk.filters};"
            " as list's) or --all"
        )
    if all_ and (ids or not flt.empty()):
        raise click.UsageError("--all cannot be combined with --id or a filter")
    if ids and (flt.statuses or flt.older_than or flt.where or flt.reason):
        raise click.UsageError("--id takes no filter but --stage: the ids are the selection")
    if ids and dry_run:
        raise click.UsageError("--dry-run counts what a filter selects, not --id")


def _call(
    conn: psycopg.Connection, bulk: Bulk, flt: Filter, before: int | None, dry_run: bool
) -> tuple[int, int, int | None]:
    """(matched, acted, newest_id) of one call of the action's SQL function."""
    row = conn.execute(
        bulk.sql,
        {
            "statuses": flt.statuses,
            "in_stage": flt.stage,
            "older_than": flt.older_than,
            "where": flt.where,
            "reason": flt.reason,
            "before": before,
            "dry_run": dry_run,
        },
    ).fetchone()
    if row is None:  # the function returns one row; nothing to act on otherwise
        return 0, 0, None
    return int(row[0]), int(row[1]), row[2]


def run_bulk(conn: psycopg.Connection, bulk: Bulk, flt: Filter, yes: bool, dry_run: bool) -> int:
    """Count what ``flt`` selects, say so, confirm (or --yes), act; the exit code."""
    matched, _, newest = _call(conn, bulk, flt, None, True)
    if not yes or dry_run:
        what = f"matching {flt.text()}" if not flt.empty() else f"(every {bulk.which} message)"
        click.echo(f"would {bulk.verb} {matched} message(s) {what}")
        if matched == 0 or dry_run:
            return 0
        if not (sys.stdin is not None and sys.stdin.isatty()):
            raise click.UsageError(
                f"stdin is not a terminal, so nobody can confirm: add --yes to {bulk.verb}"
                " them, or --dry-run to only count them"
            )
        if not click.confirm(f"{bulk.verb.capitalize()} them?", default=False, err=True):
            click.echo(f"nothing {bulk.past}")
            return 1
    if matched == 0 or newest is None:
        click.echo(f"{bulk.past} 0 message(s)")
        return 0
    now_matched, acted, _ = _call(conn, bulk, flt, newest + 1, False)
    line = f"{bulk.past} {acted} message(s)"
    if acted < now_matched:
        line += f"; {now_matched - acted} left as they were: {bulk.kept}"
    click.echo(line)
    return 0
