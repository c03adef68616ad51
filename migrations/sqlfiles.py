"""Run the frozen SQL copies of migrations/sql/ from alembic migrations.

Two trees hold SQL:

* ``sql/`` (top of the repository) holds the one live copy of every database
  object: ``sql/functions/NAME.sql`` is what ``pepsi.NAME`` is at head,
  ``sql/schema/grants.sql`` the complete privileges at head.  People edit
  those files in place, so a change is reviewed as a diff.
* ``migrations/sql/`` holds history: ``functions/NAME.vN.sql`` is revision N
  of ``pepsi.NAME`` and ``schema/NAME.vN.sql`` a one-shot schema script, each
  written once (by ``make migration``, from the live file) and never edited
  after.

A migration names revisions, it does not embed SQL:

    install(op, "claim", 2)        # migrations/sql/functions/claim.v2.sql
    run(op, "tables", 1)           # migrations/sql/schema/tables.v1.sql

and its downgrade installs the previous revision again.  Grants are not pasted
into migrations (0003..0012 did; from 0014 on they do not): each
``schema/grants.vN.sql`` is the complete, idempotent set of its time, and a
migration that adds or re-creates a function runs the next one after the
functions exist; its downgrade runs the previous one again.

The text goes to psycopg unchanged (no SQLAlchemy bind-parameter parsing,
no %-placeholders), inside alembic's migration transaction.
"""

from __future__ import annotations

from pathlib import Path

SQL_DIR = Path(__file__).resolve().parent / "sql"


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
    """Create (or replace) pepsi.NAME from migrations/sql/functions/NAME.vVERSION.sql."""
    _execute(op, function_path(name, version))


def run(op, name: str, version: int) -> None:
    """Run migrations/sql/schema/NAME.vVERSION.sql."""
    _execute(op, schema_path(name, version))
