"""Run the SQL files of sql/ from alembic migrations.

A migration names versions, it does not embed SQL:

    install(op, "claim", 2)        # sql/functions/claim.v2.sql
    run(op, "tables", 1)           # sql/schema/tables.v1.sql

and its downgrade installs the previous version again.  A function file is
never edited once a migration has installed it; a change is a new file
NAME.v(N+1).sql plus a migration.

Grants are not pasted into migrations (0003..0012 did; from 0014 on they do
not): sql/schema/grants.vN.sql is the complete, idempotent set at head, and a
migration that adds or re-creates a function writes grants.v(N+1).sql and
runs it after the functions exist; its downgrade runs grants.vN again.

The text goes to psycopg unchanged (no SQLAlchemy bind-parameter parsing,
no %-placeholders), inside alembic's migration transaction.
"""

from __future__ import annotations

from pathlib import Path

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"


def function_path(name: str, version: int) -> Path:
    return SQL_DIR / "functions" / f"{name}.v{version}.sql"


def schema_path(name: str, version: int) -> Path:
    return SQL_DIR / "schema" / f"{name}.v{version}.sql"


def _execute(op, path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    if op.get_context().as_sql:  # offline mode: emit the script
        op.execute(text)
        return
    dbapi = op.get_bind().connection.dbapi_connection
    with dbapi.cursor() as cur:
        cur.execute(text)  # no params: psycopg sends the text as is


def install(op, name: str, version: int) -> None:
    """Create (or replace) pepsi.NAME from sql/functions/NAME.vVERSION.sql."""
    _execute(op, function_path(name, version))


def run(op, name: str, version: int) -> None:
    """Run sql/schema/NAME.vVERSION.sql."""
    _execute(op, schema_path(name, version))
