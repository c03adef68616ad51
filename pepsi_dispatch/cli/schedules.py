"""``pepsi-queue schedules``: the ``[schedule-NAME]`` sections and their ticks.

What the database knows (``pepsi.schedules()``: every schedule a dispatcher
registered, its last tick and the next tick that dispatcher computed) plus
the schedules of the configuration file that no dispatcher registered yet
(their next tick computed here).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg

from pepsi_dispatch.config import ConfigError, load_config
from pepsi_dispatch.config.schedule import next_tick

__all__ = ["schedule_rows", "schedule_table"]


def schedule_rows(conn: psycopg.Connection, config_path: str | None) -> list[dict[str, Any]]:
    """One dict per schedule: name, stage, spec, last_tick, next_tick, registered."""
    cur = conn.execute("SELECT name, stage, spec, last_tick, next_tick FROM pepsi.schedules()")
    rows = {
        r[0]: {
            "name": r[0],
            "stage": r[1],
            "spec": r[2],
            "last_tick": r[3],
            "next_tick": r[4],
            "registered": True,
        }
        for r in cur.fetchall()
    }
    try:
        configured = load_config(config_path).schedules
    except ConfigError:
        configured = {}
    now = datetime.now(UTC)
    for name, s in configured.items():
        if name not in rows:
            rows[name] = {
                "name": name,
                "stage": s.stage,
                "spec": s.spec(),
                "last_tick": None,
                "next_tick": next_tick(s, now),
                "registered": False,
            }
    return [rows[n] for n in sorted(rows)]


def _when(t: datetime | None) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if t else "-"


def schedule_table(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as an aligned table (times in UTC)."""
    if not rows:
        return ["no schedules (add [schedule-NAME] sections to pepsi.conf)"]
    head = ("SCHEDULE", "STAGE", "TICKS", "LAST TICK", "NEXT TICK")
    body = []
    for r in rows:
        nxt = _when(r["next_tick"])
        if not r["registered"]:
            nxt += " (no dispatcher has registered it yet)"
        elif r["next_tick"] is None:
            nxt = "- (in no dispatcher's configuration any more)"
        body.append((r["name"], r["stage"] or "-", r["spec"] or "-", _when(r["last_tick"]), nxt))
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(4)]
    return [
        "  ".join(col.ljust(w) for col, w in zip(line[:4], widths, strict=True)) + "  " + line[4]
        for line in (head, *body)
    ]
