"""Grants live in one file: sql/schema/grants.sql (live), frozen as grants.vN.sql.

From migration 0014 on, no migration pastes GRANT/REVOKE statements and no
function file carries grants: sql/schema/grants.sql is the complete set at
head, and each migration that changes it runs its frozen revision
(migrations/sql/schema/grants.vN.sql).  These tests prove the file
is complete (alone it rebuilds head's privileges from none, and undoes drift),
that it names every API function, and that the downgrades of 0014 and 0015
give 0013 and 0014 back.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import psycopg
from test_sql_migrations import alembic, snapshot

ROOT = Path(__file__).resolve().parents[3]
VERSIONS = ROOT / "migrations" / "versions"
FROZEN = ROOT / "migrations" / "sql"
ROLES = ("pepsi_dispatcher", "pepsi_stage", "pepsi_ingress", "pepsi_dashboard", "pepsi_operator")
#: The last revision that granted inline; later ones run grants.vN.sql.
LAST_INLINE = "0013"
#: Schema files installed before grants.v2 that carry a grant of their own
#: (never edited once installed); newer schema files must not.
LEGACY_SCHEMA_GRANTS = {"stages.v1.sql", "dashboard.v1.sql", "dashboard_drop.v1.sql"}
STATEMENT = re.compile(
    r"\b(GRANT|REVOKE)\s+(ALL|EXECUTE|SELECT|INSERT|UPDATE|DELETE|USAGE|CREATE|TRUNCATE)\b"
)


def grants_file() -> Path:
    return ROOT / "sql" / "schema" / "grants.sql"


def _code_of_migration(path: Path) -> tuple[str, str]:
    """(revision, source without the module docstring and comments)."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    revision = next(
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id == "revision"
    )
    body = tree.body[1:] if isinstance(tree.body[0], ast.Expr) else tree.body
    code = "\n".join(ast.get_source_segment(text, node) or "" for node in body)
    return revision, re.sub(r"#[^\n]*", "", code)


def _sql_without_comments(path: Path) -> str:
    return re.sub(r"--[^\n]*", "", path.read_text(encoding="utf-8"))


def test_no_grants_outside_the_grants_file() -> None:
    inline = [
        path.name
        for path in VERSIONS.glob("*.py")
        for revision, code in [_code_of_migration(path)]
        if revision > LAST_INLINE and STATEMENT.search(code)
    ]
    assert inline == [], "a migration after 0013 runs grants.vN.sql instead of pasting grants"
    in_functions = [
        p.name
        for p in [*FROZEN.glob("functions/*.sql"), *(ROOT / "sql" / "functions").glob("*.sql")]
        if STATEMENT.search(_sql_without_comments(p))
    ]
    assert in_functions == [], "function files carry no grants"
    in_schema = [
        p.name
        for p in [*FROZEN.glob("schema/*.sql"), *(ROOT / "sql" / "schema").glob("*.sql")]
        if not p.name.startswith("grants.") and STATEMENT.search(_sql_without_comments(p))
    ]
    assert set(in_schema) <= LEGACY_SCHEMA_GRANTS, "grants belong in grants.vN.sql"


def test_the_check_sees_a_pasted_grant(tmp_path: Path) -> None:
    """Not vacuous: the migration scan finds op.execute('GRANT ...'), not the docstring."""
    path = tmp_path / "m.py"
    path.write_text(
        '"""Docstring: GRANT EXECUTE is fine here."""\nrevision = "0099"\n'
        "# REVOKE ALL in a comment is fine\n"
        'def upgrade():\n    op.execute("GRANT EXECUTE ON FUNCTION pepsi.x() TO r")\n'
    )
    revision, code = _code_of_migration(path)
    assert revision == "0099" and STATEMENT.findall(code) == [("GRANT", "EXECUTE")]
    path.write_text('"""GRANT EXECUTE"""\nrevision = "0099"\n# REVOKE ALL\n')
    assert STATEMENT.findall(_code_of_migration(path)[1]) == []


def test_the_grants_file_names_every_api_function() -> None:
    text = _sql_without_comments(grants_file())
    names = set(
        re.findall(
            r"CREATE OR REPLACE FUNCTION pepsi\.(\w+)\(",
            "\n".join(
                p.read_text(encoding="utf-8") for p in (ROOT / "sql" / "functions").glob("*.sql")
            ),
        )
    )
    api = {n for n in names if not n.startswith("_")}
    missing = sorted(n for n in api if f"pepsi.{n}(" not in text)
    assert missing == [], f"{grants_file().name} grants nothing on these"


def _privileges(conn: psycopg.Connection) -> dict[str, list[tuple]]:
    return {
        k: v
        for k, v in snapshot(conn).items()
        if k in ("namespaces", "relations", "columns", "functions")
    }


def test_the_grants_file_alone_rebuilds_heads_privileges(empty_dsn: str) -> None:
    alembic(empty_dsn, "upgrade", "head")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        head = _privileges(conn)
        sql = grants_file().read_text(encoding="utf-8")
        roles = ", ".join(ROLES)
        # No privilege at all for the roles, then the file: head's ACLs again.
        conn.execute(f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pepsi FROM PUBLIC, {roles}")
        conn.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA pepsi FROM PUBLIC, {roles}")
        conn.execute(f"REVOKE ALL ON SCHEMA pepsi FROM {roles}")
        assert _privileges(conn) != head
        conn.execute(sql)
        assert _privileges(conn) == head, "grants.vN.sql is the complete set at head"
        # Drift (a grant too many, one missing, PUBLIC back): the file undoes it.
        conn.execute(
            "GRANT EXECUTE ON FUNCTION pepsi.claim(bigint, text[], integer[], boolean,"
            " bigint[]) TO pepsi_stage, PUBLIC"
        )
        conn.execute(
            "REVOKE EXECUTE ON FUNCTION pepsi.finish(bigint, text, bigint) FROM pepsi_stage"
        )
        conn.execute("GRANT INSERT ON pepsi.workqueue TO pepsi_ingress")
        conn.execute(sql)
        conn.execute(sql)  # idempotent
        assert _privileges(conn) == head


def test_0014_downgrade_restores_0013_exactly(empty_dsn: str) -> None:
    """0014 runs grants.v2.sql over everything 0001..0013 granted: the ACLs of the
    existing objects do not change, and downgrade leaves exactly 0013's catalog."""
    alembic(empty_dsn, "upgrade", "0013")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        before = snapshot(conn)
        alembic(empty_dsn, "upgrade", "0014")
        after = snapshot(conn)
        new = {"dispatcher_registered", "held_ids", "stages_of"}
        changed = {"dashboard_snapshot", "queue_dispatchers"}  # v2, grants as before
        assert {f for f in after["functions"] if f[0] not in new | changed} == {
            f for f in before["functions"] if f[0] not in changed
        }
        for name in changed:
            acls = [{f[-1] for f in snap["functions"] if f[0] == name} for snap in (before, after)]
            assert acls[0] == acls[1] and len(acls[0]) == 1, name
        assert {k: v for k, v in after.items() if k != "functions"} == {
            k: v for k, v in before.items() if k != "functions"
        }, "grants.v2.sql changes no ACL that 0013 had"
        for name in new:
            acl = next(f[-1] for f in after["functions"] if f[0] == name)
            assert acl.endswith(",pepsi_dispatcher=X/" + acl.split("=")[0][1:] + "}"), acl
        alembic(empty_dsn, "downgrade", "0013")
        assert snapshot(conn) == before, "downgrade 0014 leaves exactly what 0013 had"
        alembic(empty_dsn, "upgrade", "0014")
        assert snapshot(conn) == after


def test_0015_downgrade_restores_0014_exactly(empty_dsn: str) -> None:
    """0015 adds advance_many and runs grants.v3.sql: no other ACL changes, only
    pepsi_stage may call it, and downgrade (grants.v2.sql again) gives 0014 back."""
    alembic(empty_dsn, "upgrade", "0014")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        before = snapshot(conn)
        alembic(empty_dsn, "upgrade", "0015")
        after = snapshot(conn)
        assert {f for f in after["functions"] if f[0] != "advance_many"} == set(before["functions"])
        assert {k: v for k, v in after.items() if k != "functions"} == {
            k: v for k, v in before.items() if k != "functions"
        }, "grants.v3.sql changes no ACL that 0014 had"
        acls = {f[-1] for f in after["functions"] if f[0] == "advance_many"}
        assert len(acls) == 1, acls
        owner = next(iter(acls)).split("=")[0][1:]
        assert acls == {f"{{{owner}=X/{owner},pepsi_stage=X/{owner}}}"}, acls
        alembic(empty_dsn, "downgrade", "0014")
        assert snapshot(conn) == before, "downgrade 0015 leaves exactly what 0014 had"
        alembic(empty_dsn, "upgrade", "0015")
        assert snapshot(conn) == after
