"""``pepsi-queue status --watch``: a per-stage view refreshed in place, and the
small formatters it shares with the other commands (ages, JSON values)."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timedelta
from typing import Any

import click

__all__ = ["watch_status"]


def _json_default(value: Any) -> Any:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON: {type(value).__name__}")


def _age(delta: timedelta | None) -> str:
    """'3 s', '4 min 10 s', '2 h 5 min', '3 d 4 h'; negative: 'overdue ...'."""
    if delta is None:
        return "-"
    secs = delta.total_seconds()
    if secs < 0:
        return f"overdue {_age(-delta)}"
    if secs < 10:
        return f"{secs:.1f} s"
    s = int(secs)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def watch_status(obj: Any, interval: float, count: int | None, as_json: bool) -> None:
    """Refresh a per-stage view in place until Ctrl-C (exit 0) or ``count`` frames."""
    tty = sys.stdout.isatty() and not as_json
    prev: dict[str, tuple[int, int]] = {}
    prev_t = 0.0
    frames = 0
    try:
        while True:
            conn = obj.conn()
            cur = conn.execute("SELECT * FROM pepsi.queue_overview()")
            names = [c.name for c in cur.description or ()]
            stages = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
            cur = conn.execute("SELECT * FROM pepsi.queue_dispatchers()")
            dnames = [c.name for c in cur.description or ()]
            dispatchers = [dict(zip(dnames, r, strict=True)) for r in cur.fetchall()]
            now = time.monotonic()
            dt = now - prev_t if prev_t else 0.0
            for st in stages:
                old = prev.get(st["stage"])
                if old is not None and dt > 0:
                    st["processed_per_s"] = (st["processed_total"] - old[0]) / dt
                    st["failed_per_s"] = (st["failed_total"] - old[1]) / dt
                else:
                    st["processed_per_s"] = st["failed_per_s"] = None
            prev = {st["stage"]: (st["processed_total"], st["failed_total"]) for st in stages}
            prev_t = now
            if as_json:
                frame = {"stages": stages, "dispatchers": dispatchers}
                click.echo(json.dumps(frame, default=_json_default, sort_keys=True))
            else:
                text = "\n".join(_watch_lines(stages, dispatchers))
                if tty:
                    click.echo("\x1b[H\x1b[2J" + text)  # home, clear: refresh in place
                else:
                    click.echo(text + "\n")
            frames += 1
            if count is not None and frames >= count:
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        return  # Ctrl-C ends the watch: exit 0


#: Said plainly (by ``status`` too) when no dispatcher's session is connected.
NO_LIVE_DISPATCHER = (
    "NO LIVE DISPATCHER: nothing is being dispatched; pending messages wait until"
    " pepsi-dispatch serve runs"
)


def _live(d: dict[str, Any]) -> bool:
    """A dispatcher is live as queue_dispatchers says; a schema before 0014 has
    no ``live`` column: the rule's 5-minute fallback then."""
    if "live" in d:
        return bool(d["live"])
    return d["heartbeat_age"].total_seconds() <= 300


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _watch_lines(stages: list[dict[str, Any]], dispatchers: list[dict[str, Any]]) -> list[str]:
    stamp = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S")
    width = max([5, *(len(s["stage"]) for s in stages)])
    lines = [
        f"pepsi-queue status --watch  {stamp}  (rates per second between refreshes;"
        " statistics are flushed by the dispatcher)",
        f"{'stage':<{width}} {'pending':>8} {'running':>8} {'paused':>7} {'failed':>7}"
        f" {'done/min':>8} {'proc/s':>7} {'fail/s':>7} {'oldest pending':>15}"
        f" {'next due':>12} {'workers':>8} {'max':>5}",
    ]
    for s in stages:
        failed = s["failed"] + s["timeout"] + s["expired"]
        # Live workers (busy/all) from the gauges of live dispatchers; "-" when no
        # live dispatcher runs the stage (or the schema predates queue_overview v2,
        # migration 0012). max: its PARALLELISM.
        workers = f"{s['workers_busy']}/{s['workers']}" if s.get("dispatchers") else "-"
        most = str(s["parallelism"]) if s["registered"] else "-"
        lines.append(
            f"{s['stage']:<{width}} {s['pending']:>8} {s['running']:>8} {s['paused']:>7}"
            f" {failed:>7} {s['done_last_minute']:>8} {_rate(s['processed_per_s']):>7}"
            f" {_rate(s['failed_per_s']):>7} {_age(s['oldest_pending']):>15}"
            f" {_age(s['next_due']):>12} {workers:>8} {most:>5}"
        )
    if not stages:
        lines.append("(no stages: the queue is empty and no dispatcher registered any)")
    # Live by the database's rule (queue_dispatchers v3, migration 0020): the
    # dispatcher's session is connected, whatever the age of its heartbeat.
    live = [d for d in dispatchers if _live(d)]
    lines.append("")
    if not live:
        lines.append(NO_LIVE_DISPATCHER)
    lines.append(
        f"dispatchers: {len(live)} live of {len(dispatchers)} registered"
        + "".join(
            f"\n  {d['dispatcher_id']}: {d['hostname']} pid {d['pid']}"
            f"{' competing' if d['competing'] else ''}, last beat {_age(d['heartbeat_age'])}"
            f" ago{'' if _live(d) else ' (not live)'}, {d['running']} message(s) in flight"
            for d in dispatchers
        )
    )
    lines.append(
        "workers: busy/all worker processes of live dispatchers (as of their last heartbeat;"
        " all counts idle, retiring and stopping ones); max: PARALLELISM; running = in flight"
    )
    return lines
