"""Who may call what has one source, ``sql/schema/grants.sql``; everything that
repeats it agrees with it (no database).

* Each function file's ``--   Callers:`` line names exactly the roles granted
  EXECUTE on it (``granted to nobody`` for private helpers and triggers).
* The roles table of docs/SQL.md lists exactly each role's functions and tables.
* docs/QUEUE.md's list of ``pepsi_operator``'s functions is the grants', and
  what it says is also granted to ``pepsi_dispatcher`` is.
* Every ``pepsi.NAME(`` call of a program is granted to the role it runs as:
  pepsi-queue as pepsi_operator, pepsi-httpd as pepsi_dashboard, the
  dispatcher as pepsi_dispatcher, the SDK as pepsi_stage.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from grants_source import (
    ROOT,
    by_role,
    callers,
    execute_grants,
    function_files,
    head_grants,
    header_disagreements,
    insert_grants,
    pepsi_calls,
    select_grants,
)

PACKAGE = ROOT / "pepsi_dispatch"
#: Program code -> the role it runs as.
PROGRAMS = {
    "cli": "pepsi_operator",
    "httpd": "pepsi_dashboard",
    "coordinator": "pepsi_dispatcher",
    "sdk": "pepsi_stage",
}


#: role -> (tables it reads, column INSERT grants, functions it executes)
RolesTable = dict[str, tuple[set[str], set[str], set[str]]]


def roles_table(markdown: str) -> RolesTable:
    """docs/SQL.md's roles table: its tables cell is ``SELECT on a, b`` and/or
    ``INSERT (col, col) on table``, separated by ``;``."""
    start = markdown.index("| role | schema | tables | functions |")
    out = {}
    for line in markdown[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        role, _schema, tables, functions = (c.strip() for c in line.strip("|").split("|"))
        table_set: set[str] = set()
        inserts: set[str] = set()
        for part in tables.split(";"):
            part = part.strip()
            if m := re.fullmatch(r"INSERT \(([\w, ]+)\) on (\w+)", part):
                inserts.add(f"{m[2]} ({m[1]})")
                continue
            part = part.removeprefix("SELECT on ")
            table_set |= {"*"} if part == "all" else set(re.findall(r"\w+", part))
        out[role.strip("`")] = (table_set, inserts, set(re.findall(r"\w+", functions)))
    return out


def table_disagreements(doc: RolesTable, grants_sql: str) -> list[str]:
    """One line per role whose row differs from the grants file."""
    functions = by_role(execute_grants(grants_sql))
    tables = select_grants(grants_sql)
    inserts = insert_grants(grants_sql)
    out = []
    for role in sorted(set(functions) | set(doc)):
        doc_tables, doc_inserts, doc_functions = doc.get(role, (set(), set(), set()))
        if doc_functions != functions.get(role, set()):
            extra = sorted(doc_functions - functions.get(role, set()))
            missing = sorted(functions.get(role, set()) - doc_functions)
            out.append(f"{role} functions: listed but not granted {extra}, granted {missing}")
        if doc_tables != tables.get(role, set()):
            out.append(f"{role} tables: {sorted(doc_tables)} vs {sorted(tables.get(role, set()))}")
        if doc_inserts != inserts.get(role, set()):
            granted = sorted(inserts.get(role, set()))
            out.append(f"{role} inserts: {sorted(doc_inserts)} vs {granted}")
    return out


def queue_md_lists(markdown: str) -> tuple[set[str], set[str]]:
    """(pepsi_operator's functions, those it says are not the dispatcher's) of docs/QUEUE.md."""
    start = markdown.index("The functions `pepsi_operator` may execute")
    listed = markdown[start : markdown.index("; and it may read", start)]
    names = set(re.findall(r"`(\w+)`", listed.split("):", 1)[1]))
    but = re.search(r"All but (.+?) stay granted to `pepsi_dispatcher`", markdown, re.DOTALL)
    assert but, "docs/QUEUE.md: no 'All but … stay granted to `pepsi_dispatcher`'"
    return names, set(re.findall(r"`(\w+)`", but[1]))


def ungranted_calls(calls: dict[str, set[str]], role: str, grants: dict[str, set[str]]) -> dict:
    """function -> files, for each call the role may not make."""
    return {n: sorted(files) for n, files in calls.items() if role not in grants.get(n, set())}


# -- function headers ---------------------------------------------------------------------


def test_every_callers_line_is_the_grants() -> None:
    assert header_disagreements(function_files(), head_grants()) == []


def test_callers_lines_parse() -> None:
    assert callers("--   Callers: pepsi_operator, pepsi_dispatcher (SECURITY DEFINER)") == {
        "pepsi_operator",
        "pepsi_dispatcher",
    }
    assert callers("-- x\n--   Callers: granted to nobody (claim calls it).\n") == set()
    for bad in (
        "--   Locks: none.",  # none
        "--   Callers: pepsi_stage\n--   Callers: pepsi_stage",  # two
        "--   Callers: the trigger only",  # prose
        "--   Callers: pepsi_dispatcher at start",  # prose after a role
    ):
        with pytest.raises(ValueError):
            callers(bad)


def test_the_header_check_sees_a_role_missing_or_extra() -> None:
    grants = {"cancel": {"pepsi_dispatcher", "pepsi_operator"}, "_helper": set()}
    files = {
        "cancel": "--   Callers: pepsi_dispatcher (SECURITY DEFINER).\nCREATE …",
        "_helper": "--   Callers: pepsi_stage\nCREATE …",
    }
    assert header_disagreements(files, grants) == [
        "_helper: Callers: ['pepsi_stage'], grants.sql: granted to nobody",
        "cancel: Callers: ['pepsi_dispatcher'], grants.sql: ['pepsi_dispatcher', 'pepsi_operator']",
    ]


def test_the_grants_parser_reads_every_statement() -> None:
    sql = """-- GRANT EXECUTE ON FUNCTION pepsi.commented() TO pepsi_stage;
GRANT EXECUTE ON FUNCTION
    pepsi.a(text, integer[]),
    pepsi.b()
TO pepsi_stage, pepsi_operator;
GRANT EXECUTE ON FUNCTION pepsi.a(text, integer[]) TO pepsi_dashboard;
GRANT SELECT ON ALL TABLES IN SCHEMA pepsi TO pepsi_dispatcher;
GRANT SELECT ON pepsi.workqueue, pepsi.stages TO pepsi_operator;
"""
    assert execute_grants(sql) == {
        "a": {"pepsi_stage", "pepsi_operator", "pepsi_dashboard"},
        "b": {"pepsi_stage", "pepsi_operator"},
    }
    assert select_grants(sql) == {
        "pepsi_dispatcher": {"*"},
        "pepsi_operator": {"workqueue", "stages"},
    }
    assert len(head_grants()) > 50  # the real file parses into every API function


# -- docs ---------------------------------------------------------------------------------


def test_the_roles_table_of_sql_md_is_the_grants() -> None:
    doc = roles_table((ROOT / "docs" / "SQL.md").read_text(encoding="utf-8"))
    grants_sql = (ROOT / "sql" / "schema" / "grants.sql").read_text(encoding="utf-8")
    assert table_disagreements(doc, grants_sql) == []


def test_the_roles_table_check_sees_a_wrong_row() -> None:
    grants_sql = """GRANT EXECUTE ON FUNCTION pepsi.reschedule(bigint) TO pepsi_operator;
GRANT SELECT ON pepsi.workqueue TO pepsi_operator;
GRANT INSERT (stage, payload) ON pepsi.workqueue TO pepsi_operator, pepsi_ingress;"""
    doc = roles_table(
        "| role | schema | tables | functions |\n|---|---|---|---|\n"
        "| `pepsi_operator` | USAGE | SELECT on workqueue, config; INSERT (stage) on workqueue"
        " | cancel |\n"
        "| `pepsi_ingress` | USAGE | INSERT (stage, payload) on workqueue | — |\n"
    )
    assert table_disagreements(doc, grants_sql) == [
        "pepsi_operator functions: listed but not granted ['cancel'], granted ['reschedule']",
        "pepsi_operator tables: ['config', 'workqueue'] vs ['workqueue']",
        "pepsi_operator inserts: ['workqueue (stage)'] vs ['workqueue (stage, payload)']",
    ]


def test_queue_md_lists_the_operators_functions() -> None:
    names, not_dispatchers = queue_md_lists((ROOT / "docs" / "QUEUE.md").read_text("utf-8"))
    roles = by_role(head_grants())
    assert names == roles["pepsi_operator"]
    assert not_dispatchers == roles["pepsi_operator"] - roles["pepsi_dispatcher"]


def test_the_queue_md_check_sees_a_missing_function() -> None:
    names, but = queue_md_lists(
        "The functions `pepsi_operator` may execute (grants): `cancel`, `purge`; and it may"
        " read x.\n\nAll but `enqueue` stay granted to `pepsi_dispatcher` (before)."
    )
    assert names == {"cancel", "purge"} != by_role(head_grants())["pepsi_operator"]
    assert but == {"enqueue"}


# -- code ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("folder", "role"), sorted(PROGRAMS.items()))
def test_every_call_of_a_program_is_granted_to_its_role(folder: str, role: str) -> None:
    calls = pepsi_calls(PACKAGE / folder)
    assert calls, f"no pepsi.* call found under pepsi_dispatch/{folder}"
    assert ungranted_calls(calls, role, head_grants()) == {}


def test_the_call_check_sees_an_ungranted_call(tmp_path: Path) -> None:
    (tmp_path / "q.py").write_text('conn.execute("SELECT pepsi.claim(%s)")\n# pepsi.cancel(\n')
    calls = pepsi_calls(tmp_path)
    assert set(calls) == {"claim", "cancel"}
    assert list(ungranted_calls(calls, "pepsi_operator", head_grants())) == ["claim"]
