"""Every SQL statement of the coordinator lives under coordinator/database/.

The loop routes facts between the database side and the workers' side; the
database side (coordinator/database/) is the one port to PostgreSQL. A string
literal that is a statement (not a docstring or a log message) anywhere else
in the coordinator fails this test.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

COORDINATOR = Path(__file__).resolve().parents[3] / "pepsi_dispatch" / "coordinator"
STATEMENT = re.compile(
    r"^\s*(SELECT|INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM|WITH\s+\w+\s+AS|LISTEN|NOTIFY|"
    r"SET\s+\w+\s*(=|TO)|BEGIN|COMMIT|ROLLBACK)\b",
)  # upper case: the code writes SQL keywords so (test_sql_no_table_access.py too)


def docstrings(tree: ast.Module) -> set[int]:
    """ids of the string nodes that are docstrings."""
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                out.add(id(value))
    return out


def sql_literals(source: str) -> list[str]:
    """The string literals of ``source`` that begin an SQL statement."""
    tree = ast.parse(source)
    skip = docstrings(tree)
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skip
        and STATEMENT.match(node.value)
    ]


def test_no_sql_text_in_the_coordinator_outside_its_database_package() -> None:
    found = {}
    for path in sorted(COORDINATOR.rglob("*.py")):
        if "database" in path.relative_to(COORDINATOR).parts:
            continue
        hits = sql_literals(path.read_text(encoding="utf-8"))
        if hits:
            found[str(path.relative_to(COORDINATOR))] = hits
    assert found == {}, "move these statements into coordinator/database/"


def test_the_check_sees_a_statement_but_not_a_docstring() -> None:
    source = '"""SELECT in a docstring is prose."""\nQ = "SELECT pepsi.claim(%s)"\n'
    assert sql_literals(source) == ["SELECT pepsi.claim(%s)"]
