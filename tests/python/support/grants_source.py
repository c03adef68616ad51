"""Who may call what, read from its one source, ``sql/schema/grants.sql``, and from
the places that repeat it (function headers, docs, code), so tests can compare them.

No database: the GRANT statements are parsed as text. The grants file writes
one statement per privilege kind, ``GRANT EXECUTE ON FUNCTION pepsi.a(...),
pepsi.b(...) TO role, role;``, which is all this parser reads.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
GRANTS = ROOT / "sql" / "schema" / "grants.sql"
FUNCTIONS = ROOT / "sql" / "functions"
ROLES = ("pepsi_ingress", "pepsi_stage", "pepsi_dispatcher", "pepsi_dashboard", "pepsi_operator")
NOBODY = "granted to nobody"

_CREATE = re.compile(r"CREATE OR REPLACE FUNCTION pepsi\.(\w+)\(")
_CALLERS = re.compile(r"^--\s+Callers:(?P<rest>.*)$", re.MULTILINE)
_GRANT_EXECUTE = re.compile(
    r"GRANT\s+EXECUTE\s+ON\s+FUNCTION\s+(?P<what>.+?)\s+TO\s+(?P<roles>[\w\s,]+)$", re.DOTALL
)
_GRANT_SELECT = re.compile(
    r"GRANT\s+SELECT\s+ON\s+(?P<what>.+?)\s+TO\s+(?P<roles>[\w\s,]+)$", re.DOTALL
)
_GRANT_INSERT = re.compile(
    r"GRANT\s+INSERT\s+\((?P<columns>[\w\s,]+)\)\s+ON\s+pepsi\.(?P<table>\w+)"
    r"\s+TO\s+(?P<roles>[\w\s,]+)$",
    re.DOTALL,
)


def without_comments(sql: str) -> str:
    """The SQL text with every ``--`` comment removed (the grants file has no strings)."""
    return re.sub(r"--[^\n]*", "", sql)


def _statements(sql: str) -> list[str]:
    return [s.strip() for s in without_comments(sql).split(";") if s.strip()]


def _roles(text: str) -> set[str]:
    return {r.strip() for r in text.split(",") if r.strip()}


def execute_grants(sql: str) -> dict[str, set[str]]:
    """function name -> the roles granted EXECUTE on it (functions of several
    signatures are one name; the grants file names each once)."""
    out: dict[str, set[str]] = {}
    for stmt in _statements(sql):
        m = _GRANT_EXECUTE.match(stmt)
        if not m:
            continue
        for name in re.findall(r"pepsi\.(\w+)\s*\(", m["what"]):
            out.setdefault(name, set()).update(_roles(m["roles"]))
    return out


def select_grants(sql: str) -> dict[str, set[str]]:
    """role -> the tables it may SELECT (``*`` for ALL TABLES IN SCHEMA pepsi)."""
    out: dict[str, set[str]] = {}
    for stmt in _statements(sql):
        m = _GRANT_SELECT.match(stmt)
        if not m:
            continue
        what = m["what"]
        tables = {"*"} if "ALL TABLES" in what else set(re.findall(r"pepsi\.(\w+)", what))
        for role in _roles(m["roles"]):
            out.setdefault(role, set()).update(tables)
    return out


def insert_grants(sql: str) -> dict[str, set[str]]:
    """role -> the column INSERT grants it holds, each as ``table (col, col)``."""
    out: dict[str, set[str]] = {}
    for stmt in _statements(sql):
        m = _GRANT_INSERT.match(stmt)
        if not m:
            continue
        columns = ", ".join(c.strip() for c in m["columns"].split(","))
        for role in _roles(m["roles"]):
            out.setdefault(role, set()).add(f"{m['table']} ({columns})")
    return out


def by_role(grants: dict[str, set[str]]) -> dict[str, set[str]]:
    """role -> the functions it may execute."""
    out: dict[str, set[str]] = {r: set() for r in ROLES}
    for name, roles in grants.items():
        for role in roles:
            out.setdefault(role, set()).add(name)
    return out


def head_grants() -> dict[str, set[str]]:
    """EXECUTE grants of ``sql/schema/grants.sql``."""
    return execute_grants(GRANTS.read_text(encoding="utf-8"))


def function_files(folder: Path = FUNCTIONS) -> dict[str, str]:
    """function name -> the text of its live file."""
    out = {}
    for path in sorted(folder.glob("*.sql")):
        text = path.read_text(encoding="utf-8")
        m = _CREATE.search(text)
        assert m, f"{path.name}: no CREATE OR REPLACE FUNCTION pepsi.NAME("
        out[m[1]] = text
    return out


def callers(header: str) -> set[str]:
    """The roles of a function file's ``--   Callers:`` line: ``ROLE, ROLE (a note)``,
    or ``granted to nobody (a note)`` (an empty set). ValueError when the line is
    missing, repeated, or names something that is not a role."""
    lines = _CALLERS.findall(header)
    if len(lines) != 1:
        raise ValueError(f"{len(lines)} '--   Callers:' lines (want 1)")
    listed = lines[0].split(" (", 1)[0].strip().rstrip(".")
    if listed == NOBODY:
        return set()
    roles = _roles(listed)
    unknown = sorted(r for r in roles if r not in ROLES)
    if unknown or not roles:
        raise ValueError(f"Callers: {listed!r} is not '{NOBODY}' nor roles of {ROLES}")
    return roles


def header_disagreements(files: dict[str, str], grants: dict[str, set[str]]) -> list[str]:
    """One line per function whose ``Callers:`` line and the grants differ."""
    out = []
    for name, text in sorted(files.items()):
        try:
            listed = callers(text)
        except ValueError as exc:
            out.append(f"{name}: {exc}")
            continue
        granted = grants.get(name, set())
        if listed != granted:
            said, given = sorted(listed) or NOBODY, sorted(granted) or NOBODY
            out.append(f"{name}: Callers: {said}, grants.sql: {given}")
    return out


def pepsi_calls(folder: Path) -> dict[str, set[str]]:
    """function name -> the names of the files under ``folder`` that call ``pepsi.NAME(``."""
    out: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        for name in re.findall(r"\bpepsi\.(\w+)\((?!\d\))", path.read_text(encoding="utf-8")):
            out.setdefault(name, set()).add(path.name)
    return out
