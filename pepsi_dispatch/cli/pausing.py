"""``pepsi-queue pause STAGE`` and ``pepsi-queue resume STAGE``.

Both go through ``pepsi.pause_stage``, the function behind the dashboard's
Pause, Resume and Try now buttons: the overlay row ``[stage-NAME] PAUSED =
yes`` is written or deleted and every dispatcher reloads. A paused stage
claims nothing (running messages finish; its rows stay where they are).
``resume`` also ends the stage's hold-off at once, paused or not: "try now"
after fixing a program that kept dying, instead of waiting out its cooldown
(up to 60 s). The group in cli/queue.py adds these commands; ``obj`` is its
context (``conn()``, ``config_path``).
"""

from __future__ import annotations

import difflib
from typing import Any

import click
import psycopg

__all__ = ["pause_command", "resume_command"]


def _pause_stage(obj: Any, stage: str, paused: bool) -> bool:
    """``pepsi.pause_stage``; a refused name (22023) is a usage error naming the
    closest registered stage."""
    try:
        row = obj.conn().execute("SELECT pepsi.pause_stage(%s, %s)", (stage, paused)).fetchone()
    except psycopg.errors.InvalidParameterValue as exc:
        known = [r[0] for r in obj.conn().execute("SELECT stage FROM pepsi.registered_stages()")]
        close = difflib.get_close_matches(stage, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        served = f" (the dispatcher serves: {', '.join(sorted(known)) or 'none'})"
        raise click.UsageError(f"{exc.diag.message_primary}{served}{hint}") from None
    return bool(row and row[0])


@click.command(
    "pause",
    help="Claim nothing more for STAGE: running messages finish, its rows stay where they are.",
)
@click.argument("stage")
@click.pass_obj
def pause_command(obj: Any, stage: str) -> None:
    if _pause_stage(obj, stage, True):
        click.echo(
            f"paused stage {stage}: nothing new is claimed for it; running messages finish"
            " ('pepsi-queue resume' lets it run again)"
        )
    else:
        click.echo(f"stage {stage} was paused already")


@click.command(
    "resume",
    help="Let a paused STAGE run again; also ends its hold-off at once (try now, after a fix).",
)
@click.argument("stage")
@click.pass_obj
def resume_command(obj: Any, stage: str) -> None:
    if _pause_stage(obj, stage, False):
        click.echo(f"resumed stage {stage}; its hold-off, if any, ends now")
    else:
        click.echo(
            f"stage {stage} was not paused (in the database's overlay); its hold-off,"
            " if any, ends now"
        )
