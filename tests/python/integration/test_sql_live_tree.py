"""sql/ is what runs; migrations/ is how it got there; the two never disagree.

* A database migrated from base to head has exactly the live bodies of
  ``sql/functions/*.sql`` and the privileges of ``sql/schema/grants.sql``:
  re-running every live file at head touches every pepsi function and
  changes nothing.
* Every live file is its newest frozen revision in ``migrations/sql/``
  (a live edit with no migration is reported, ``make migration`` fixes it).
* The committed schema dump ``migrations/head_schema.sql`` is what the
  migrations build (``make schema-dump`` rewrites it).
* Upgrade, downgrade one step, upgrade again, from every revision: the same
  schema each time.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import psycopg
import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from pepsi_dispatch.devtools import schemadump

ROOT = Path(__file__).resolve().parents[3]
LIVE = ROOT / "sql"


def _new_migration_module():
    spec = importlib.util.spec_from_file_location(
        "new_migration", ROOT / "scripts" / "new_migration.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


STATE = """
    SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid), p.proacl::text
      FROM pg_proc p WHERE p.pronamespace = 'pepsi'::regnamespace
    UNION ALL
    SELECT c.oid::regclass::text, c.relkind::text, c.relacl::text
      FROM pg_class c WHERE c.relnamespace = 'pepsi'::regnamespace
    UNION ALL
    SELECT nspname, 'schema', nspacl::text FROM pg_namespace WHERE nspname = 'pepsi'
    ORDER BY 1
"""
TOUCHED = """
    SELECT p.oid::regprocedure::text FROM pg_proc p
     WHERE p.pronamespace = 'pepsi'::regnamespace AND p.xmin = pg_current_xact_id()::xid
"""
ALL_FUNCTIONS = (
    "SELECT oid::regprocedure::text FROM pg_proc WHERE pronamespace = 'pepsi'::regnamespace"
)


def run_live_files(conn: psycopg.Connection, live: Path = LIVE) -> tuple[set[str], list[tuple]]:
    """Inside the caller's transaction: run every live file; (functions it wrote, state after)."""
    for path in sorted((live / "functions").glob("*.sql")):
        conn.execute(path.read_text(encoding="utf-8"))
    touched = {row[0] for row in conn.execute(TOUCHED)}
    conn.execute((live / "schema" / "grants.sql").read_text(encoding="utf-8"))
    return touched, conn.execute(STATE).fetchall()


def live_files_drift(dsn: str, live: Path = LIVE) -> tuple[set[str], set[str], list[tuple]]:
    """(functions no live file writes, live writes not at head, state rows that changed)."""
    with psycopg.connect(dsn) as conn:
        before = conn.execute(STATE).fetchall()
        at_head = {row[0] for row in conn.execute(ALL_FUNCTIONS)}
        touched, after = run_live_files(conn, live)
        conn.rollback()
    changed = sorted(set(before) ^ set(after), key=str)
    return at_head - touched, touched - at_head, changed


def test_a_database_at_head_has_exactly_the_live_bodies_and_grants(dsn: str) -> None:
    unwritten, extra, changed = live_files_drift(dsn)
    assert unwritten == set(), "pepsi functions at head with no live file in sql/functions/"
    assert extra == set(), "live files create functions that head does not have"
    assert changed == [], "a live file differs from what the migrations installed"


def test_the_live_check_sees_a_body_edited_without_a_migration(dsn: str, tmp_path: Path) -> None:
    """Not vacuous: one live body changed alone is reported."""
    for kind in ("functions", "schema"):
        (tmp_path / kind).mkdir()
        for path in (LIVE / kind).glob("*.sql"):
            (tmp_path / kind / path.name).write_text(path.read_text(encoding="utf-8"))
    edited = tmp_path / "functions" / "heartbeat.sql"
    text = edited.read_text(encoding="utf-8")
    edited.write_text(re.sub(r"\bBEGIN\b", "BEGIN\n    PERFORM 1;", text, count=1))
    unwritten, extra, changed = live_files_drift(dsn, tmp_path)
    assert unwritten == set() and extra == set()
    assert [row[0] for row in changed] == ["pepsi.heartbeat(bigint,jsonb)"] * 2


def test_every_live_file_is_its_newest_frozen_revision() -> None:
    pending = _new_migration_module().pending_changes()
    assert [f"sql/{c.kind}/{c.name}.sql" for c in pending] == [], "run make migration NAME=…"


def test_make_migration_freezes_an_edited_live_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live edit becomes revision N+1 and a migration whose downgrade installs N."""
    module = _new_migration_module()
    for kind in ("functions", "schema"):
        (tmp_path / "live" / kind).mkdir(parents=True)
        (tmp_path / "frozen" / kind).mkdir(parents=True)
    (tmp_path / "versions").mkdir()
    (tmp_path / "versions" / "0026_claim_lines.py").write_text("")
    (tmp_path / "frozen" / "functions" / "claim.v9.sql").write_text("old\n")
    (tmp_path / "live" / "functions" / "claim.sql").write_text("new\n")
    (tmp_path / "live" / "functions" / "brand_new.sql").write_text("fresh\n")
    monkeypatch.setattr(module, "LIVE", tmp_path / "live")
    monkeypatch.setattr(module, "FROZEN", tmp_path / "frozen")
    monkeypatch.setattr(module, "VERSIONS", tmp_path / "versions")
    monkeypatch.setattr(module, "ROOT", tmp_path)
    assert module.main(["--check"]) == 1
    assert module.main(["claim skips locked rows"]) == 0
    assert (tmp_path / "frozen" / "functions" / "claim.v10.sql").read_text() == "new\n"
    assert (tmp_path / "frozen" / "functions" / "brand_new.v1.sql").read_text() == "fresh\n"
    text = (tmp_path / "versions" / "0027_claim_skips_locked_rows.py").read_text()
    assert 'down_revision = "0026"' in text
    assert 'install(op, "claim", 10)' in text and 'install(op, "brand_new", 1)' in text
    assert (
        'install(op, "claim", 9)' in text and 'op.execute("DROP FUNCTION pepsi.brand_new")' in text
    )
    assert module.main(["--check"]) == 0, "nothing left to freeze"


def test_the_committed_schema_dump_is_what_the_migrations_build(dsn: str) -> None:
    committed = schemadump.DUMP_PATH.read_text(encoding="utf-8")
    assert schemadump.dump(dsn) == committed, (
        "migrations/head_schema.sql is stale: run make schema-dump"
    )


def test_the_dump_check_sees_a_change_the_migrations_did_not_make(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE INDEX stray_idx ON pepsi.workqueue (updated_at)")
    assert schemadump.dump(dsn) != schemadump.DUMP_PATH.read_text(encoding="utf-8")


def _alembic_config(dsn: str, monkeypatch: pytest.MonkeyPatch) -> Config:
    monkeypatch.setenv("PEPSI_DSN", dsn)
    monkeypatch.chdir(ROOT)
    return Config(str(ROOT / "alembic.ini"))


def test_upgrade_downgrade_upgrade_from_every_revision_gives_the_same_schema(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _alembic_config(empty_dsn, monkeypatch)
    revisions = [
        s.revision for s in reversed(list(ScriptDirectory.from_config(config).walk_revisions()))
    ]
    assert len(revisions) >= 26 and revisions[0] == "0001"
    before = schemadump.dump(empty_dsn)  # base: nothing of pepsi
    for revision in revisions:
        command.upgrade(config, revision)
        built = schemadump.dump(empty_dsn)
        command.downgrade(config, "-1")
        assert schemadump.dump(empty_dsn) == before, f"{revision}: its downgrade is not undone"
        command.upgrade(config, revision)
        assert schemadump.dump(empty_dsn) == built, f"{revision}: a second upgrade differs"
        before = built
    assert schemadump.dump(empty_dsn) == schemadump.DUMP_PATH.read_text(encoding="utf-8")
    assert os.environ["PEPSI_DSN"] == empty_dsn
