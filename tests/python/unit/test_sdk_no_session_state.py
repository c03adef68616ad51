"""The SDK keeps nothing in a database session between transactions (no database).

Behind a pooler in transaction mode (PgBouncer) each transaction of a worker may
run in another server session, so the SDK's SQL must not rely on one: no SET
without LOCAL, no session advisory lock, no LISTEN, no temporary table, no
PREPARE of its own. The exceptions never run behind a pooler: the reset a
worker runs before it gives a lent session back (``lending.RESET_SESSION``,
which only undoes such state; the template lends nothing there) and the
client check a direct connection gets at connect (``connection.CHECK_CLIENT``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SDK = [
    *sorted((ROOT / "pepsi_dispatch" / "sdk").glob("*.py")),
    ROOT / "pepsi_dispatch" / "worker.py",
]

#: SQL that leaves state in the session (SET LOCAL and set_config(..., true) do not).
SESSION_STATE = re.compile(
    r"\bSET\s+(?!LOCAL\b)(SESSION\s+)?[a-z_.]+\s*(=|TO\b)"
    r"|set_config\s*\([^)]*,\s*false\s*\)"
    r"|pg_(try_)?advisory_lock(_shared)?\s*\("
    r"|\bLISTEN\b"
    r"|\bCREATE\s+(TEMP|TEMPORARY)\b"
    r"|\bPREPARE\s+\w+",
    re.IGNORECASE,
)


def offending(path: Path) -> list[str]:
    """The string literals of ``path`` (docstrings, ``RESET_SESSION`` and
    ``CHECK_CLIENT`` aside)
    whose SQL would leave state in the session."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            skip.add(id(node.value))  # a docstring, or a bare string: no SQL run
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in ("RESET_SESSION", "CHECK_CLIENT")
            for t in node.targets
        ):
            skip.update(id(child) for child in ast.walk(node.value))
    return [
        f"{path.name}:{node.lineno}: {node.value[:80]!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skip
        and SESSION_STATE.search(node.value)
    ]


def test_the_sdk_sql_keeps_no_session_state() -> None:
    assert [line for path in SDK for line in offending(path)] == []


def test_the_scan_finds_session_state(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        'A = "SET search_path = x"\nB = "SET LOCAL lock_timeout = 1"\n'
        'C = "SELECT pg_advisory_lock(1)"\nD = "LISTEN x"\nE = "CREATE TEMP TABLE t (x int)"\n'
        "F = \"SELECT set_config('a.b', '1', false)\"\nG = \"SELECT pg_advisory_xact_lock(1)\"\n"
    )
    found = [line.split(":")[1] for line in offending(sample)]
    assert found == ["1", "3", "4", "5", "6"]
