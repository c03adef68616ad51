"""The claim's and the finish's plans and costs, probed on a live queue.

``probe(conn, stage)`` runs, in one transaction that it rolls back, what a
dispatcher and a worker run for a batch: ``pepsi.claim_lines`` of up to
``BATCH`` rows of the stage (after enqueueing ``BATCH`` rows, so the claim
always has work whatever the load's backlog), then ``pepsi.finish_many`` of
what it claimed. ``auto_explain`` (loaded in that session only, its output
sent to the client as NOTICEs) reports each statement the two functions run,
with its plan, its buffers and its time. Nothing of it stays: the live
dispatcher skips the rows the probe holds for those milliseconds.

A plan's *shape* is its nodes' types and the relations and indexes they
read, without the numbers; its *cost* the shared buffers it touched (hit and
read), which does not depend on the machine's speed as time does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import psycopg

BATCH = 16
DISPATCHER_ID = -1  # the probe's own holder: no live dispatcher has it

SETTINGS = (
    "LOAD 'auto_explain'",
    "SET LOCAL auto_explain.log_min_duration = 0",
    "SET LOCAL auto_explain.log_nested_statements = on",
    "SET LOCAL auto_explain.log_analyze = on",
    "SET LOCAL auto_explain.log_buffers = on",
    "SET LOCAL auto_explain.log_timing = off",
    "SET LOCAL auto_explain.log_format = 'json'",
    "SET LOCAL auto_explain.log_level = 'notice'",
)


@dataclass(frozen=True)
class Probe:
    """One function's statements as planned and run: shapes and shared buffers."""

    shapes: tuple[str, ...]
    buffers: int
    rows: int


def shape(node: dict[str, Any]) -> str:
    """A plan node and its children as text, without costs or counts. A read
    through an index is named by the index alone: a plain, an index-only and a
    bitmap scan of one index are the same access path, and which one a generic
    plan gets flips with the statistics autovacuum gathers (a seq scan or another
    index is a different shape)."""
    kind = node.get("Node Type", "?")
    kids = node.get("Plans", [])
    if kind == "Bitmap Heap Scan" and [k.get("Node Type") for k in kids] == ["Bitmap Index Scan"]:
        return f"Index read relation={node.get('Relation Name')} index={kids[0].get('Index Name')}"
    if kind in ("Index Scan", "Index Only Scan"):
        return f"Index read relation={node.get('Relation Name')} index={node.get('Index Name')}"
    parts = [kind]
    for key in ("Relation Name", "Index Name"):
        if key in node:
            parts.append(f"{key.split()[0].lower()}={node[key]}")
    inner = ",".join(shape(child) for child in kids)
    return " ".join(parts) + (f"[{inner}]" if inner else "")


def buffers(node: dict[str, Any]) -> int:
    """Shared buffers hit and read by the top node (it counts its children's)."""
    return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))


def _explained(notices: list[str]) -> list[dict[str, Any]]:
    plans = []
    for text in notices:
        start = text.find("{")
        if start < 0:
            continue
        try:
            plans.append(json.loads(text[start:]))
        except ValueError:
            continue
    return plans


def _measured(notices: list[str], function: str, rows: int) -> Probe:
    """The statements a function ran (its own top-level call left out)."""
    inner = [
        p["Plan"] for p in _explained(notices) if f"pepsi.{function}" not in p.get("Query Text", "")
    ]
    return Probe(
        shapes=tuple(shape(p) for p in inner), buffers=sum(buffers(p) for p in inner), rows=rows
    )


def probe(conn: psycopg.Connection, stage: str) -> dict[str, Probe]:
    """Claim and finish a batch of ``stage`` in a transaction rolled back; per
    function, the statements' plan shapes and the buffers they touched."""
    notices: list[str] = []

    def keep(diag: psycopg.errors.Diagnostic) -> None:
        notices.append(diag.message_primary or "")

    conn.add_notice_handler(keep)
    try:
        with conn.transaction(force_rollback=True):
            for setting in SETTINGS:
                conn.execute(setting)
            conn.execute(
                "SELECT pepsi.enqueue_many(%s, array_fill('{}'::jsonb, ARRAY[%s]))",
                (stage, BATCH),
            )
            notices.clear()
            claimed = [
                row[0]
                for row in conn.execute(
                    "SELECT workqueue_id FROM pepsi.claim_lines(%s, ARRAY[%s], ARRAY[%s], true)",
                    (DISPATCHER_ID, stage, BATCH),
                )
            ]
            claim = _measured(notices, "claim_lines", len(claimed))
            notices.clear()
            finished = conn.execute(
                "SELECT pepsi.finish_many(%s::bigint[], %s, %s)", (claimed, stage, DISPATCHER_ID)
            ).fetchall()
            finish = _measured(notices, "finish_many", len(finished))
        return {"claim_lines": claim, "finish_many": finish}
    finally:
        conn.remove_notice_handler(keep)


def probe_new_session(dsn: str, stage: str) -> dict[str, Probe]:
    """``probe`` in a session of its own, so each function is planned anew (as
    after a restart); the second of two probes is kept, the first paying the
    session's catalog look-ups."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        probe(conn, stage)
        return probe(conn, stage)
