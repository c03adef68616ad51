"""alembic history: versions swap function bodies, and base leaves nothing behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[3]
CLAIM = "pepsi.claim(bigint, text[], integer[], boolean)"
CLAIM4 = "pepsi.claim(bigint, text[], integer[], boolean, bigint[])"  # 0007 on
HEARTBEAT = "pepsi.heartbeat(bigint)"
REQUEUE_DUE = "pepsi.requeue_due(text[], integer[], integer, interval)"


def alembic(dsn: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "alembic", *args],
        cwd=ROOT,
        env={**os.environ, "PEPSI_DSN": dsn},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"alembic {args} failed:\n{result.stdout}{result.stderr}"
    return result.stdout


def body_of(name: str, version: int) -> str:
    """The function body ($$ … $$) of the frozen migrations/sql/functions/NAME.vVERSION.sql."""
    text = (ROOT / "migrations" / "sql" / "functions" / f"{name}.v{version}.sql").read_text()
    match = re.search(r"\bAS \$\$(.*)\$\$;", text, re.S)
    assert match, f"no body in {name}.v{version}.sql"
    return match.group(1)


def definition(conn: psycopg.Connection, signature: str) -> tuple[str, str]:
    return conn.execute(
        "SELECT pg_get_functiondef(%s::regprocedure), prosrc FROM pg_proc"
        " WHERE oid = %s::regprocedure",
        (signature, signature),
    ).fetchone()


SNAPSHOT = {
    "namespaces": """
        SELECT nspname, nspacl::text FROM pg_namespace WHERE nspname LIKE 'pepsi%'""",
    "relations": """
        SELECT c.relname, c.relkind, c.reloptions::text, c.relacl::text
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'pepsi'""",
    "columns": """
        SELECT c.relname, a.attname, a.attacl::text
          FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'pepsi' AND a.attacl IS NOT NULL""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), md5(p.prosrc),
               p.prosecdef, p.proconfig::text, p.proacl::text
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'pepsi'""",
    "types": """
        SELECT t.typname, t.typtype FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
         WHERE n.nspname = 'pepsi'""",
    "triggers": """
        SELECT t.tgname, pg_get_triggerdef(t.oid)
          FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'pepsi' AND NOT t.tgisinternal""",
    "constraints": """
        SELECT c.conname, pg_get_constraintdef(c.oid)
          FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
         WHERE n.nspname = 'pepsi'""",
    "indexes": """
        SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'pepsi'""",
}


def snapshot(conn: psycopg.Connection) -> dict[str, list[tuple]]:
    return {key: sorted(conn.execute(sql).fetchall()) for key, sql in SNAPSHOT.items()}


def leftovers(conn: psycopg.Connection) -> list[tuple]:
    """Anything of ours outside what alembic itself keeps (public.alembic_version)."""
    return conn.execute(
        """
        SELECT 'namespace', nspname FROM pg_namespace WHERE nspname LIKE 'pepsi%'
        UNION ALL
        SELECT 'relation', c.oid::regclass::text FROM pg_class c
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE (c.relname LIKE 'pepsi%' OR n.nspname = 'public' OR n.nspname LIKE 'pepsi%')
           AND c.relname NOT IN ('alembic_version', 'alembic_version_pkc')
        UNION ALL
        SELECT 'function', p.oid::regprocedure::text FROM pg_proc p
          JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE p.proname LIKE 'pepsi%' OR p.proname LIKE '\\_notify%' OR n.nspname = 'public'
        UNION ALL
        SELECT 'type', t.oid::regtype::text FROM pg_type t
          JOIN pg_namespace n ON n.oid = t.typnamespace
         WHERE t.typname LIKE 'pepsi%' OR t.typname LIKE '\\_pepsi%'
            OR (n.nspname = 'public' AND t.typname NOT LIKE '%alembic_version')
        UNION ALL
        SELECT 'trigger', tgname FROM pg_trigger WHERE NOT tgisinternal
        UNION ALL
        SELECT 'event trigger', evtname FROM pg_event_trigger
        """
    ).fetchall()


def test_a_migration_installs_a_version_and_its_downgrade_restores_the_previous(
    empty_dsn: str,
) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        alembic(empty_dsn, "upgrade", "0001")
        v1_def, v1_src = definition(conn, CLAIM)
        assert v1_src == body_of("claim", 1), "0001 installs claim.v1.sql as written"

        alembic(empty_dsn, "upgrade", "0002")
        v2_def, v2_src = definition(conn, CLAIM)
        assert v2_src == body_of("claim", 2), "0002 installs claim.v2.sql as written"
        assert v2_def != v1_def
        assert "FROM picked" in v1_def and "= ANY (ARRAY(" in v2_def

        alembic(empty_dsn, "downgrade", "0001")
        assert definition(conn, CLAIM) == (v1_def, v1_src), "downgrade reinstalls claim v1"

        alembic(empty_dsn, "upgrade", "0003")
        hb1 = definition(conn, HEARTBEAT)
        assert hb1[1] == body_of("heartbeat", 1)
        alembic(empty_dsn, "upgrade", "0004")
        assert definition(conn, HEARTBEAT)[1] == body_of("heartbeat", 2)
        alembic(empty_dsn, "downgrade", "0003")
        assert definition(conn, HEARTBEAT) == hb1, "downgrade reinstalls heartbeat v1"

        def grants(signature: str) -> tuple[bool, bool, bool]:
            return conn.execute(
                "SELECT has_function_privilege('pepsi_dispatcher', %s, 'EXECUTE'),"
                " has_function_privilege('pepsi_stage', %s, 'EXECUTE'),"
                " has_function_privilege('pepsi_ingress', %s, 'EXECUTE')",
                (signature, signature, signature),
            ).fetchone()

        # Grants survive the swap (CREATE OR REPLACE keeps the ACL).
        alembic(empty_dsn, "upgrade", "0006")
        v3 = definition(conn, CLAIM)
        assert v3[1] == body_of("claim", 3)
        assert grants(CLAIM) == (True, False, False)
        # 0007 changes the signature: drop, create, grant again (not to PUBLIC).
        alembic(empty_dsn, "upgrade", "0007")
        assert definition(conn, CLAIM4)[1] == body_of("claim", 4)
        assert grants(CLAIM4) == (True, False, False)
        assert conn.execute("SELECT to_regprocedure(%s)", (CLAIM,)).fetchone() == (None,)
        alembic(empty_dsn, "downgrade", "0006")
        assert definition(conn, CLAIM) == v3, "downgrade reinstalls claim v3"
        assert grants(CLAIM) == (True, False, False)
        assert conn.execute("SELECT to_regprocedure(%s)", (CLAIM4,)).fetchone() == (None,)
        alembic(empty_dsn, "upgrade", "0007")
        rq1 = definition(conn, REQUEUE_DUE)
        assert rq1[1] == body_of("requeue_due", 1)
        # 0008 changes the return type (same arguments): drop, create, grant again.
        alembic(empty_dsn, "upgrade", "0008")
        assert definition(conn, REQUEUE_DUE)[1] == body_of("requeue_due", 2)
        assert grants(REQUEUE_DUE) == (True, False, False)
        alembic(empty_dsn, "downgrade", "0007")
        assert definition(conn, REQUEUE_DUE) == rq1, "downgrade reinstalls requeue_due v1"
        assert grants(REQUEUE_DUE) == (True, False, False)
        alembic(empty_dsn, "upgrade", "head")
        assert grants(CLAIM4) == (True, False, False)
        assert grants(REQUEUE_DUE) == (True, False, False)


def test_head_base_head_leaves_no_stray_objects(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert leftovers(conn) == []
        alembic(empty_dsn, "upgrade", "head")
        first = snapshot(conn)
        assert len(first["functions"]) >= 30 and len(first["relations"]) >= 10

        alembic(empty_dsn, "downgrade", "base")
        assert leftovers(conn) == [], "downgrade base leaves nothing of pepsi behind"
        assert conn.execute("SELECT count(*) FROM alembic_version").fetchone() == (0,)

        alembic(empty_dsn, "upgrade", "head")
        assert snapshot(conn) == first, "a second upgrade builds exactly the same objects"
        heads = alembic(empty_dsn, "heads")
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] in heads


def test_offline_sql_script_matches_the_online_migration(tmp_path: Path) -> None:
    """`alembic upgrade head --sql` gives DBAs a script psql can apply."""
    out = alembic("postgresql:///unused", "upgrade", "head", "--sql")
    assert out.count("CREATE OR REPLACE FUNCTION pepsi.claim(") == 9  # v1 .. v9
    assert out.count("CREATE OR REPLACE FUNCTION pepsi.claim_lines(") == 2  # v1, v2
    assert "DROP FUNCTION pepsi.claim(bigint, text[], integer[], boolean)" in out
    assert "CREATE SCHEMA pepsi;" in out
