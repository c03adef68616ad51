"""Run the pgTAP suite (tests/sql) with pg_prove against a fresh, migrated database.

The cluster is $PEPSI_TEST_DSN when set, else the project's embedded cluster under
.pepsi/ (stopped again afterwards when this run started it, so `make test` in a
fresh clone leaves no server running). A database named pepsi_pgtap_<pid> is
created, migrated with `alembic upgrade head`, given the pgtap extension, tested,
and dropped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pepsi_dispatch.devtools import embedded

ROOT = Path(__file__).resolve().parents[1]
LIBPQ_ENV = {
    "host": "PGHOST",
    "port": "PGPORT",
    "dbname": "PGDATABASE",
    "user": "PGUSER",
    "password": "PGPASSWORD",
    "sslmode": "PGSSLMODE",
}


def main() -> int:
    if os.environ.get("PEPSI_TEST_DSN"):
        return run_suite(os.environ["PEPSI_TEST_DSN"])
    base = ROOT / ".pepsi"
    started_here = not embedded.is_running(base)
    try:
        return run_suite(embedded.start(base, "postgres"))
    finally:
        if started_here:
            embedded.stop(base)


def run_suite(admin: str) -> int:
    """Create, migrate and test a scratch database on the cluster of ``admin``; drop it."""
    name = f"pepsi_pgtap_{os.getpid()}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = make_conninfo(admin, dbname=name)
    try:
        env = {**os.environ, "PEPSI_DSN": dsn}
        migrate = subprocess.run(
            [sys.executable, "-m", "alembic", "upgrade", "head"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        if migrate.returncode != 0:
            print(migrate.stdout + migrate.stderr, file=sys.stderr)
            return 1
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pgtap")
        files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "sql").rglob("*.sql"))
        if not files:
            print("error: no pgTAP files under tests/sql", file=sys.stderr)
            return 1
        # pg_prove takes its connection from libpq's environment variables; its own
        # --dbname option does not accept a connection string.
        libpq_env = {
            **os.environ,
            **{
                LIBPQ_ENV[k]: v
                for k, v in conninfo_to_dict(dsn).items()
                if k in LIBPQ_ENV and v is not None
            },
        }
        result = subprocess.run(["pg_prove", "--failures", *files], cwd=ROOT, env=libpq_env)
        return result.returncode
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    sys.exit(main())
