"""Stage names given on pepsi-queue's command line: known, or "did you mean"."""

from __future__ import annotations

import difflib
from typing import Any

import click

__all__ = ["check_enqueue_stage", "check_stage_name", "known_stages"]


def known_stages(obj: Any, with_queue: bool = False) -> tuple[set[str], list[str]]:
    """Stage names the registered stage table, the configuration file and (with
    ``with_queue``) the messages in the queue know, and where they were looked
    up (for messages). ``obj`` has ``conn()`` and ``config_path``."""
    from pepsi_dispatch.config import load_config

    known: set[str] = set()
    sources: list[str] = []
    rows = obj.conn().execute("SELECT stage FROM pepsi.registered_stages()").fetchall()
    if rows:
        known.update(r[0] for r in rows)
        sources.append("the dispatcher's registered stages")
    config = load_config(obj.config_path)
    if config.path is not None:
        known.update(config.stages)
        sources.append(f"{config.path}")
    if with_queue:
        rows = obj.conn().execute("SELECT DISTINCT stage FROM pepsi.queue_counts()").fetchall()
        if rows:
            known.update(r[0] for r in rows)
            sources.append("the queue")
    return known, sources


def _unknown(stage: str, known: set[str], sources: list[str], tail: str) -> click.UsageError:
    close = difflib.get_close_matches(stage, sorted(known), n=1)
    advice = [f"did you mean {close[0]!r}?"] if close else []
    if tail:
        advice.append(tail.strip())
    return click.UsageError(
        f"unknown stage {stage!r}: not in {' nor '.join(sources)}"
        f" (known: {', '.join(sorted(known)) or 'none'})"
        + (f"; {' '.join(advice)}" if advice else "")
    )


def check_enqueue_stage(obj: Any, stage: str) -> bool:
    """Refuse a stage no registered stage table nor configuration knows; False
    if there was nothing to check against."""
    known, sources = known_stages(obj)
    if not sources:
        return False
    if stage not in known:
        raise _unknown(stage, known, sources, " --force enqueues anyway")
    return True


def check_stage_name(obj: Any, stage: str | None) -> None:
    """For a selecting ``--stage`` (failed, requeue, cancel, list): refuse a name
    that neither the registry, the configuration nor any message in the queue
    carries, with the closest known name. Nothing to check against: accepted."""
    if stage is None:
        return
    known, sources = known_stages(obj, with_queue=True)
    if sources and stage not in known:
        raise _unknown(stage, known, sources, "")
