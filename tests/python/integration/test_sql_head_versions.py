"""Migration `head` installs the highest frozen revision of every file in migrations/sql/.

A new NAME.vN.sql that no migration installs -- or a migration that installs
an older version after a newer one -- would otherwise go unnoticed: every test
runs against whatever head installs.  Two checks: the migrations' own
``install(op, "name", N)`` / ``run(op, "name", N)`` calls, read from their
source in revision order, and the function bodies in a database at head.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import psycopg
from test_sql_migrations import alembic, body_of

ROOT = Path(__file__).resolve().parents[3]
VERSIONS = ROOT / "migrations" / "versions"
FILE_RE = re.compile(r"^(?P<name>.+)\.v(?P<version>[0-9]+)\.sql$")


def highest(kind: str, sql_dir: Path = ROOT / "migrations" / "sql") -> dict[str, int]:
    """NAME -> highest N of migrations/sql/KIND/NAME.vN.sql (the frozen revisions)."""
    out: dict[str, int] = {}
    for path in (sql_dir / kind).glob("*.sql"):
        m = FILE_RE.match(path.name)
        assert m, f"migrations/sql/{kind}/{path.name} is not named NAME.vN.sql"
        name, version = m["name"], int(m["version"])
        out[name] = max(out.get(name, 0), version)
    return out


def _module_constants(tree: ast.Module) -> dict[str, Any]:
    consts: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                try:
                    consts[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    return consts


def _bind(target: ast.expr, value: Any, env: dict[str, Any]) -> None:
    if isinstance(target, ast.Name):
        env[target.id] = value
    elif isinstance(target, ast.Tuple):
        for t, v in zip(target.elts, value, strict=True):
            _bind(t, v, env)


def _calls(stmts: list[ast.stmt], env: dict[str, Any], out: list[tuple[str, str, int]]) -> None:
    """(function, name, version) of every install/run call, in execution order."""
    for stmt in stmts:
        if isinstance(stmt, ast.For):
            seq = env.get(stmt.iter.id) if isinstance(stmt.iter, ast.Name) else None
            if isinstance(stmt.iter, ast.Call) and isinstance(stmt.iter.func, ast.Name):
                if stmt.iter.func.id == "reversed" and isinstance(stmt.iter.args[0], ast.Name):
                    seq = list(reversed(env[stmt.iter.args[0].id]))
            func = stmt.iter.func if isinstance(stmt.iter, ast.Call) else None
            if (  # for name, signature in TABLE.items():
                isinstance(func, ast.Attribute)
                and func.attr == "items"
                and isinstance(func.value, ast.Name)
            ):
                seq = list(env[func.value.id].items())
            if seq is None:
                seq = ast.literal_eval(stmt.iter)
            for item in seq:
                inner = dict(env)
                _bind(stmt.target, item, inner)
                _calls(stmt.body, inner, out)
            continue
        for node in ast.walk(stmt):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("install", "run")
            ):
                name_node, version_node = node.args[1], node.args[2]
                name = env[name_node.id] if isinstance(name_node, ast.Name) else name_node.value
                version = (
                    env[version_node.id]
                    if isinstance(version_node, ast.Name)
                    else version_node.value
                )
                out.append((node.func.id, name, int(version)))


def migrations() -> list[tuple[str, ast.Module, dict[str, Any]]]:
    """(revision, tree, constants) in upgrade order, following down_revision."""
    by_down: dict[str | None, tuple[str, ast.Module, dict[str, Any]]] = {}
    for path in VERSIONS.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        consts = _module_constants(tree)
        entry = (consts["revision"], tree, consts)
        assert consts["down_revision"] not in by_down, f"two migrations follow {entry[0]}"
        by_down[consts["down_revision"]] = entry
    ordered = []
    down: str | None = None
    while down in by_down:
        ordered.append(by_down[down])
        down = by_down[down][0]
    assert len(ordered) == len(by_down), "the migrations do not form one chain"
    return ordered


def function_calls(tree: ast.Module, consts: dict[str, Any], fn: str) -> list:
    out: list[tuple[str, str, int]] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == fn:
            _calls(node.body, dict(consts), out)
    return out


def installed_at_head() -> dict[str, int]:
    """NAME -> the revision of pepsi.NAME the last upgrade() installing it installs."""
    installed: dict[str, int] = {}
    for _rev, tree, consts in migrations():
        for kind, name, version in function_calls(tree, consts, "upgrade"):
            if kind == "install":
                installed[name] = version
    return installed


def stale(installed: dict[str, int], want: dict[str, int]) -> dict[str, tuple[int | None, int]]:
    """NAME -> (installed, highest) wherever head does not install the highest version."""
    return {n: (installed.get(n), v) for n, v in want.items() if installed.get(n) != v}


def test_head_installs_the_highest_version_of_every_function_file() -> None:
    installed = installed_at_head()
    want = highest("functions")
    assert stale(installed, want) == {}, "head must install the highest NAME.vN.sql of every NAME"
    assert set(installed) <= set(want), "a migration installs a file that does not exist"
    # The parse found the calls inside loops too (0001 installs v1 of every
    # function of its list; 0009 loops over its new functions).
    assert installed["heartbeat"] >= 2 and installed["advance"] >= 2
    assert installed["_check_stage"] == 1 and "cancel" in installed


def test_the_check_reports_a_version_nobody_installs(tmp_path: Path) -> None:
    """Not vacuous: a newer file that no migration installs is reported."""
    (tmp_path / "functions").mkdir()
    for path in (ROOT / "migrations" / "sql" / "functions").glob("*.sql"):
        (tmp_path / "functions" / path.name).write_text("")
    newest = highest("functions")["claim"] + 1
    (tmp_path / "functions" / f"claim.v{newest}.sql").write_text("")
    assert stale(installed_at_head(), highest("functions", tmp_path)) == {
        "claim": (newest - 1, newest)
    }


def test_every_schema_file_version_is_run_by_a_migration() -> None:
    used: dict[str, set[int]] = {}
    for _rev, tree, consts in migrations():
        for fn in ("upgrade", "downgrade"):
            for kind, name, version in function_calls(tree, consts, fn):
                if kind == "run":
                    used.setdefault(name, set()).add(version)
    for name, version in highest("schema").items():
        assert version in used.get(name, set()), (
            f"migrations/sql/schema/{name}.v{version}.sql is never run"
        )


def test_a_database_at_head_runs_the_highest_version_of_every_function(empty_dsn: str) -> None:
    alembic(empty_dsn, "upgrade", "head")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        for name, version in sorted(highest("functions").items()):
            rows = conn.execute(
                "SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                " WHERE n.nspname = 'pepsi' AND p.proname = %s",
                (name,),
            ).fetchall()
            if not (ROOT / "sql" / "functions" / f"{name}.sql").exists():
                # Dropped by a migration (its frozen revisions stay, for the downgrades).
                assert rows == [], f"pepsi.{name} has no live file but exists at head"
                continue
            assert len(rows) == 1, f"pepsi.{name}: {len(rows)} functions at head (want 1)"
            assert rows[0][0] == body_of(name, version), (
                f"pepsi.{name} at head is not migrations/sql/functions/{name}.v{version}.sql"
            )


def test_0009_downgrade_restores_0008_exactly(empty_dsn: str) -> None:
    """Functions (bodies, ACLs), tables, constraints and indexes of 0008 come back."""
    from test_sql_migrations import snapshot

    alembic(empty_dsn, "upgrade", "0008")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        before = snapshot(conn)
        alembic(empty_dsn, "upgrade", "0009")
        after = snapshot(conn)
        assert after != before
        names = {f[0] for f in after["functions"]}
        assert {"cancel", "register_stages", "message_story", "queue_overview"} <= names
        acl = dict(
            conn.execute(
                "SELECT p.oid::regprocedure::text, p.proacl::text FROM pg_proc p"
                " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'pepsi'"
                " AND p.proname IN ('enqueue', 'enqueue_many', 'cancel', 'record_dispatch_error')"
            ).fetchall()
        )
        assert "pepsi_ingress=X" in acl["pepsi.enqueue(text,jsonb,timestamp with time zone)"]
        assert "pepsi_stage=X" in acl["pepsi.enqueue(text,jsonb,timestamp with time zone)"]
        assert "pepsi_dispatcher=X" in acl["pepsi.cancel(bigint[],text,boolean)"]
        assert "pepsi_stage" not in acl["pepsi.cancel(bigint[],text,boolean)"]
        alembic(empty_dsn, "downgrade", "0008")
        assert snapshot(conn) == before, "downgrade 0009 leaves exactly what 0008 had"


def test_0012_downgrade_restores_0011_exactly(empty_dsn: str) -> None:
    """queue_overview v2 (new result type: dropped and granted again), dashboard_cancel v2
    and dashboard_requeue v2 (same signatures: grants kept); downgrade gives 0011 back."""
    from test_sql_migrations import definition, snapshot

    alembic(empty_dsn, "upgrade", "0011")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        before = snapshot(conn)
        alembic(empty_dsn, "upgrade", "0012")
        assert snapshot(conn) != before
        signatures = {
            "queue_overview": "pepsi.queue_overview()",
            "dashboard_cancel": "pepsi.dashboard_cancel(bigint[])",
            "dashboard_requeue": "pepsi.dashboard_requeue(bigint[])",
        }
        for name, signature in signatures.items():
            assert definition(conn, signature)[1] == body_of(name, 2), name

        def may(role: str, signature: str) -> bool:
            return conn.execute(
                "SELECT has_function_privilege(%s, %s, 'EXECUTE')", (role, signature)
            ).fetchone()[0]

        roles = ("pepsi_dispatcher", "pepsi_dashboard", "pepsi_stage", "pepsi_ingress", "public")
        assert [may(r, signatures["queue_overview"]) for r in roles] == [
            True,
            False,
            False,
            False,
            False,
        ]
        for name in ("dashboard_cancel", "dashboard_requeue"):
            assert [may(r, signatures[name]) for r in roles] == [
                False,
                True,
                False,
                False,
                False,
            ], name
        alembic(empty_dsn, "downgrade", "0011")
        assert snapshot(conn) == before, "downgrade 0012 leaves exactly what 0011 had"


def test_0019_downgrade_restores_0018_exactly(empty_dsn: str) -> None:
    """enqueue/enqueue_many v3 and claim v5 (new signatures: dropped and granted
    again), the new functions' grants; downgrade gives 0018 back exactly."""
    from test_sql_migrations import snapshot

    alembic(empty_dsn, "upgrade", "0018")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        before = snapshot(conn)
        alembic(empty_dsn, "upgrade", "0019")
        acl = dict(
            conn.execute(
                "SELECT p.oid::regprocedure::text, p.proacl::text FROM pg_proc p"
                " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'pepsi'"
                " AND p.proname IN ('enqueue', 'enqueue_many', 'claim', 'reschedule',"
                " 'dashboard_reschedule', 'fire_schedule')"
            ).fetchall()
        )
        enqueue = "pepsi.enqueue(text,jsonb,timestamp with time zone,integer,text)"
        many = "pepsi.enqueue_many(text,jsonb[],timestamp with time zone,integer,text[])"
        assert len([k for k in acl if k.startswith("pepsi.enqueue(")]) == 1, acl
        for role in ("pepsi_ingress", "pepsi_stage"):
            assert f"{role}=X" in acl[enqueue] and f"{role}=X" in acl[many]
        claim = "pepsi.claim(bigint,text[],integer[],boolean,bigint[])"
        assert "pepsi_dispatcher=X" in acl[claim] and "pepsi_stage" not in acl[claim]
        resched = "pepsi.reschedule(bigint,timestamp with time zone)"
        assert "pepsi_dispatcher=X" in acl[resched] and "pepsi_operator=X" in acl[resched]
        assert "pepsi_stage" not in acl[resched]
        dashboard = "pepsi.dashboard_reschedule(bigint,timestamp with time zone)"
        assert "pepsi_dashboard=X" in acl[dashboard]
        alembic(empty_dsn, "downgrade", "0018")
        assert snapshot(conn) == before, "downgrade 0019 leaves exactly what 0018 had"
