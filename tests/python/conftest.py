"""Shared pytest fixtures: a real PostgreSQL and a fresh, migrated database per test.

`$PEPSI_TEST_DSN` (a superuser DSN) is used when set; otherwise the session starts
a throwaway cluster of its own (see pepsi_dispatch.devtools.embedded) and removes it after.
Each test gets its own database, cloned from a template migrated once per session
with `alembic upgrade head`, so tests never depend on each other or on order.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pepsi_dispatch.devtools import embedded

ROOT = Path(__file__).resolve().parents[2]


def with_dbname(dsn: str, dbname: str) -> str:
    """The same connection string, pointed at another database."""
    return make_conninfo(dsn, dbname=dbname)


def alembic(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run alembic from the repository root against `dsn`; raise with its output on failure."""
    env = {**os.environ, "PEPSI_DSN": dsn}
    result = subprocess.run(
        [sys.executable, "-m", "alembic", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        raise AssertionError(f"alembic {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    return result


@pytest.fixture(scope="session")
def pg_admin_dsn() -> Iterator[str]:
    """Superuser DSN of the cluster the tests use."""
    given = os.environ.get("PEPSI_TEST_DSN")
    if given:
        yield given
        return
    base = Path(tempfile.mkdtemp(prefix="pepsi-test-", dir="/tmp"))
    try:
        yield embedded.start(base, "postgres", fast=True)
    finally:
        embedded.destroy(base)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(pg_admin_dsn: str) -> Iterator[str]:
    """Name of a database migrated to head, used as the template for each test's database."""
    name = f"pepsi_tmpl_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        alembic(with_dbname(pg_admin_dsn, name), "upgrade", "head")
        yield name
    finally:
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def scratch_database(admin_dsn: str, template: str | None = None) -> Iterator[str]:
    """A new database (empty, or cloned from `template`), dropped on exit; yields its DSN."""
    name = f"pepsi_t_{uuid.uuid4().hex[:12]}"
    clone = f' TEMPLATE "{template}"' if template else ""
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"{clone}')
    try:
        yield with_dbname(admin_dsn, name)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def empty_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """DSN of a fresh, empty (unmigrated) database, dropped after the test."""
    with scratch_database(pg_admin_dsn) as dsn:
        yield dsn


@pytest.fixture
def dsn(pg_admin_dsn: str, template_db: str) -> Iterator[str]:
    """DSN of a fresh database migrated to head, dropped after the test."""
    with scratch_database(pg_admin_dsn, template_db) as dsn:
        yield dsn


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection]:
    """Autocommit connection to the test's database."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        yield connection
