"""The Python side reads and writes no table of schema pepsi.

The SQL functions are the only surface: a statement in pepsi_dispatch/ may
call ``pepsi.NAME(...)`` but never name a table after FROM, JOIN, UPDATE,
INSERT INTO, DELETE FROM, TRUNCATE or COPY.  The tables are those that
migrations/sql/schema/ creates.  devtools/ (the benchmark, the demo) set up and
inspect their own test data and are left out.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "pepsi_dispatch"
EXEMPT = ("devtools/**/*.py",)


def tables() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "migrations" / "sql" / "schema").glob("*.sql"):
        found.update(re.findall(r"CREATE TABLE pepsi\.(\w+)", path.read_text(encoding="utf-8")))
    return found


def table_access(text: str, names: set[str]) -> list[str]:
    """The statements' fragments in ``text`` that name a table (not a function call).

    SQL keywords are matched in upper case, as the code writes them, so prose
    ("... into pepsi.stages") in docstrings and comments does not count.
    """
    pattern = re.compile(
        r"\b(?:FROM|JOIN|UPDATE|INSERT\s+INTO|DELETE\s+FROM|TRUNCATE|COPY)\s+"
        r"(?:ONLY\s+)?pepsi\.(" + "|".join(sorted(names)) + r")\b(?!\s*\()"
    )
    return [m.group(0) for m in pattern.finditer(text)]


def checked_files() -> list[Path]:
    exempt = {p for pattern in EXEMPT for p in PACKAGE.glob(pattern)}
    return sorted(p for p in PACKAGE.rglob("*.py") if p not in exempt)


def test_the_schema_has_the_tables_the_check_looks_for() -> None:
    assert {"workqueue", "dispatchers", "config", "stages", "stage_stats"} <= tables()


def test_no_module_names_a_table_in_its_sql() -> None:
    names = tables()
    found = {
        str(path.relative_to(ROOT)): hits
        for path in checked_files()
        if (hits := table_access(path.read_text(encoding="utf-8"), names))
    }
    assert found == {}, "go through a pepsi.* function (sql/functions/) instead"


def test_the_check_sees_table_sql_and_lets_function_calls_pass() -> None:
    """Not vacuous: what the database calls had before 0014 is found; calls are not."""
    names = tables()
    before = (
        '"SELECT section, option, value FROM pepsi.config ORDER BY section, option"\n'
        '"SELECT * FROM pepsi.dispatchers"\n'
        "\"SELECT workqueue_id FROM pepsi.workqueue WHERE status = 'running'\"\n"
        '"UPDATE pepsi.workqueue SET x = 1"  "DELETE FROM pepsi.stage_stats"\n'
        '"INSERT INTO pepsi.config VALUES (1)"  "x JOIN pepsi.stages s ON true"\n'
    )
    assert len(table_access(before, names)) == 7
    calls = (
        '"SELECT * FROM pepsi.queue_dispatchers()"  "SELECT * FROM pepsi.stages_of(%s)"\n'
        '"SELECT workqueue_id FROM pepsi.held_ids (%s)"\n'
        '"""The stage table into pepsi.stages; rows of pepsi.config."""\n'
    )
    assert table_access(calls, names) == []
    assert PACKAGE / "coordinator" / "database" / "postgres.py" in checked_files()
    assert PACKAGE / "devtools" / "bench" / "core.py" not in checked_files()
