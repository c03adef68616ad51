"""docs/INTERNALS.md draws a message's status machine once; the drawing agrees
with the schema, the functions and the grants (no database).

Each edge of the mermaid block under "A message's status" reads
``FROM --> TO: function, function [role, role]``. The statuses are those of
the workqueue's CHECK constraint (``migrations/head_schema.sql``), and all of
them are drawn; each function has a live file whose statements name the
status the edge leads to (``'TO'``; an INSERT for ``[*] -->``, a DELETE for
``--> [*]``), directly or in a ``pepsi.*`` function it calls (a coarse check:
it catches an edge drawn to the wrong function, not a wrong branch inside
one); the roles are exactly those ``sql/schema/grants.sql`` grants it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from grants_source import ROOT, function_files, head_grants, without_comments

EDGE = re.compile(
    r"^\s*(?P<src>\[\*\]|\w+) --> (?P<dst>\[\*\]|\w+):"
    r" (?P<functions>[\w, ]+) \[(?P<roles>[\w, ]+)\]$"
)


@dataclass(frozen=True)
class Edge:
    """One arrow of the drawing."""

    src: str
    dst: str
    functions: tuple[str, ...]
    roles: frozenset[str]


def drawing(markdown: str) -> list[Edge]:
    """The edges of the mermaid block of the section "A message's status"."""
    section = markdown[markdown.index("## A message's status") :]
    block = section[section.index("```mermaid") : section.index("```\n", 10)]
    edges = []
    for line in block.splitlines()[2:]:
        m = EDGE.match(line)
        assert m, f"not an edge 'FROM --> TO: function, ... [role, ...]': {line!r}"
        edges.append(
            Edge(
                m["src"],
                m["dst"],
                tuple(f.strip() for f in m["functions"].split(",")),
                frozenset(r.strip() for r in m["roles"].split(",")),
            )
        )
    return edges


def schema_statuses() -> set[str]:
    """The statuses the workqueue's CHECK constraint allows."""
    dump = (ROOT / "migrations" / "head_schema.sql").read_text(encoding="utf-8")
    check = re.search(r"CONSTRAINT workqueue_status_known CHECK \((.+)\)", dump)
    assert check, "no workqueue_status_known in migrations/head_schema.sql"
    return set(re.findall(r"'(\w+)'::text", check[1]))


def _writes(name: str, dst: str, files: dict[str, str], depth: int = 1) -> bool:
    body = without_comments(files[name])
    body = body[body.index("AS $") :]
    word = {"[*]": "DELETE FROM"}.get(dst, f"'{dst}'")
    if word in body:
        return True
    called = set(re.findall(r"pepsi\.(\w+)\(", body)) & set(files) - {name}
    return depth > 0 and any(_writes(c, dst, files, depth - 1) for c in called)


def disagreements(
    edges: list[Edge], statuses: set[str], files: dict[str, str], grants: dict[str, set[str]]
) -> list[str]:
    """One line per way the drawing and the code differ."""
    out = []
    drawn = {s for e in edges for s in (e.src, e.dst)} - {"[*]"}
    if drawn != statuses:
        out.append(f"statuses drawn {sorted(drawn)}, in the CHECK {sorted(statuses)}")
    for e in edges:
        for fn in e.functions:
            arrow = f"{e.src} --> {e.dst}: {fn}"
            if fn not in files:
                out.append(f"{arrow}: no such function")
                continue
            if e.src == "[*]" and "INSERT INTO pepsi.workqueue" not in without_comments(files[fn]):
                out.append(f"{arrow}: inserts no row")
            elif not _writes(fn, e.dst, files):
                out.append(f"{arrow}: never names {e.dst}")
            if set(e.roles) != grants.get(fn, set()):
                out.append(
                    f"{arrow}: drawn {sorted(e.roles)}, granted {sorted(grants.get(fn, ()))}"
                )
    return out


def test_the_drawing_is_the_schema_the_functions_and_the_grants() -> None:
    edges = drawing((ROOT / "docs" / "INTERNALS.md").read_text(encoding="utf-8"))
    assert len(edges) > 20
    assert disagreements(edges, schema_statuses(), function_files(), head_grants()) == []


def test_the_check_sees_a_wrong_role_status_and_function() -> None:
    files, grants = function_files(), head_grants()
    broken = [
        Edge("pending", "running", ("claim",), frozenset({"pepsi_operator"})),
        Edge("running", "done", ("fail",), frozenset({"pepsi_stage"})),
        Edge(
            "running", "cancelled", ("cancel",), frozenset({"pepsi_dispatcher", "pepsi_operator"})
        ),
        Edge("done", "[*]", ("vacuum",), frozenset({"pepsi_dispatcher"})),
    ]
    assert disagreements(broken, {"pending", "running", "done"}, files, grants) == [
        "statuses drawn ['cancelled', 'done', 'pending', 'running'],"
        " in the CHECK ['done', 'pending', 'running']",
        "pending --> running: claim: drawn ['pepsi_operator'], granted ['pepsi_dispatcher']",
        "running --> done: fail: never names done",
        "running --> cancelled: cancel: never names cancelled",
        "done --> [*]: vacuum: no such function",
    ]
