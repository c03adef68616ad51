"""The committed schema dump of head: what the migrations build, as one reviewable file.

``migrations/head_schema.sql`` is ``pg_dump --schema-only --schema=pepsi`` of a
database migrated from base to head, normalised (no comments, no ``SET``
lines, no owners, no per-dump keys) so that two dumps of the same schema are
byte-identical.  A migration's effect on tables, indexes, triggers, functions
and grants then shows in review as a diff of this file, and a test fails when
the file and the migrations disagree.

    python -m pepsi_dispatch.devtools.schemadump            # rewrite the file
    python -m pepsi_dispatch.devtools.schemadump --check    # exit 1 if stale

Both migrate a scratch database: ``$PEPSI_DSN`` names a superuser connection
of a running cluster, else a throwaway embedded cluster is started.
"""

from __future__ import annotations

import argparse
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
from psycopg.conninfo import make_conninfo

from pepsi_dispatch.devtools import embedded
from pepsi_dispatch.schema.resources import data_root

__all__ = ["DUMP_PATH", "dump", "normalise"]

DUMP_PATH = data_root() / "migrations" / "head_schema.sql"
# pg_dump's own comment lines and session settings; function bodies keep theirs
# (pg_dump writes its comments at column 0 in these forms only).
_DROPPED_PREFIXES = (
    "-- Name: ",
    "-- PostgreSQL database dump",
    "-- Dumped from ",
    "-- Dumped by ",
    "SET ",
    "SELECT pg_catalog.set_config",
    "\\restrict",
    "\\unrestrict",
)


def normalise(text: str) -> str:
    """pg_dump output without what varies between dumps of one schema."""
    kept = [
        line.rstrip()
        for line in text.splitlines()
        if line != "--" and not line.startswith(_DROPPED_PREFIXES)
    ]
    out: list[str] = []
    for line in kept:
        if line == "" and (not out or out[-1] == ""):
            continue  # one blank line between statements, none at the top
        out.append(line)
    return "\n".join(out).strip() + "\n"


def _pg_dump() -> str:
    found = shutil.which("pg_dump")
    if found:
        return found
    return str(embedded.find_bindir() / "pg_dump")


def dump(dsn: str) -> str:
    """The normalised schema-only dump of schema pepsi in the database at `dsn`."""
    result = subprocess.run(
        [_pg_dump(), "--schema-only", "--schema=pepsi", "--no-owner", "--dbname", dsn],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if result.returncode != 0:
        if "no matching schemas" in result.stderr:
            return ""  # base: no schema pepsi at all
        raise RuntimeError(f"pg_dump failed: {result.stderr.strip()}")
    return normalise(result.stdout)


def migrate(dsn: str, *target: str) -> None:
    """``alembic upgrade head`` (or the given command) against `dsn`, from the schema's root."""
    cmd = [sys.executable, "-m", "alembic", *(target or ("upgrade", "head"))]
    env = {**os.environ, "PEPSI_DSN": dsn}
    result = subprocess.run(
        cmd, cwd=data_root(), env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"alembic {' '.join(cmd[3:])} failed:\n{result.stdout}{result.stderr}")


@contextmanager
def scratch_database(admin_dsn: str | None) -> Iterator[str]:
    """A new empty database (dropped after), in `admin_dsn`'s cluster or a throwaway one."""
    if admin_dsn is None:
        base = Path(tempfile.mkdtemp(prefix="pepsi-dump-", dir="/tmp"))
        try:
            with scratch_database(embedded.start(base, "postgres", fast=True)) as dsn:
                yield dsn
        finally:
            embedded.destroy(base)
            shutil.rmtree(base, ignore_errors=True)
        return
    name = f"pepsi_dump_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(admin_dsn, dbname=name)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the committed schema dump of head")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the committed dump is stale"
    )
    args = parser.parse_args(argv)
    with scratch_database(os.environ.get("PEPSI_DSN")) as dsn:
        migrate(dsn)
        text = dump(dsn)
    if args.check:
        if DUMP_PATH.read_text(encoding="utf-8") != text:
            print(f"{DUMP_PATH} is stale: run make schema-dump and commit it", file=sys.stderr)
            return 1
        return 0
    DUMP_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {DUMP_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
