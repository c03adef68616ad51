"""An embedded PostgreSQL cluster of the project's own, for `make db`, `make demo` and tests.

The cluster uses the system's PostgreSQL binaries, listens on a Unix socket only
(no TCP port is taken) and lives under a directory of the caller's choosing
(`.pepsi/` for `make db`). PostgreSQL refuses to run as root, so when we are
root the server runs as the `postgres` account; if that account cannot reach
the requested directory (a checkout under /root, say) the cluster is placed in
/tmp and linked from the requested directory.

Command line:  python -m pepsi_dispatch.devtools.embedded start DIR [--dbname NAME]
               python -m pepsi_dispatch.devtools.embedded stop DIR
`start` prints the DSN of database NAME (created if missing) on stdout.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

SOCKET_PATH_LIMIT = 100  # sun_path is 108 bytes; keep room for "/.s.PGSQL.5432"


class EmbeddedError(RuntimeError):
    """The embedded cluster could not be set up; the message says why and how to fix it."""


def find_bindir() -> Path:
    """Return the directory holding initdb/pg_ctl of the newest installed PostgreSQL."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if candidates:
        return Path(candidates[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise EmbeddedError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found; install them with "
        "'apt-get install postgresql' (or run 'make system-deps' as root)"
    )


def _as_server_user() -> list[str]:
    """Command prefix that runs a command as the account the server must run as."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError as exc:
        raise EmbeddedError(
            "running as root, but there is no 'postgres' account to run PostgreSQL as; "
            "install the postgresql package or run as an ordinary user"
        ) from exc
    return ["runuser", "-u", "postgres", "--"]


def _server_user_can_use(path: Path) -> bool:
    if os.geteuid() != 0:
        return True
    probe = path if path.exists() else path.parent
    result = subprocess.run(
        [*_as_server_user(), "test", "-w", str(probe), "-a", "-x", str(probe)],
        capture_output=True,
    )
    return result.returncode == 0


def cluster_home(base: Path) -> Path:
    """Where the cluster's files really live for the requested directory `base`."""
    base = base.resolve()
    home = base / "cluster"
    if home.is_symlink():
        return home.resolve()
    base.mkdir(parents=True, exist_ok=True)
    needs_tmp = not _server_user_can_use(base) or len(str(home / "run")) > SOCKET_PATH_LIMIT
    if needs_tmp:
        digest = hashlib.sha1(str(base).encode()).hexdigest()[:12]
        real = Path(f"/tmp/pepsi-embedded-{digest}")
        real.mkdir(parents=True, exist_ok=True)
        if not home.exists():
            home.symlink_to(real)
        return real
    home.mkdir(exist_ok=True)
    return home


def _chown_for_server(path: Path) -> None:
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(path, pw.pw_uid, pw.pw_gid)


def _run(cmd: list[str], what: str) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise EmbeddedError(f"{what} failed ({' '.join(cmd)}):\n{result.stdout}{result.stderr}")


def dsn_for(home: Path, dbname: str) -> str:
    """libpq URI for database `dbname` on the embedded cluster at `home`."""
    return f"postgresql:///{dbname}?host={home / 'run'}&user=postgres"


def start(base: Path, dbname: str = "pepsi", fast: bool = False) -> str:
    """Initialise (once) and start (if not running) the cluster; create `dbname`; return its DSN."""
    bindir = find_bindir()
    home = cluster_home(base)
    _chown_for_server(home)
    data, run, log = home / "data", home / "run", home / "postgres.log"
    as_pg = _as_server_user()
    if not (data / "PG_VERSION").exists():
        _run(
            [
                *as_pg,
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
            "initdb",
        )
    run.mkdir(exist_ok=True)
    _chown_for_server(run)
    if not _server_running(data):
        options = f"-k {run} -c listen_addresses='' -c max_connections=200"
        if fast:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        _run(
            [
                *as_pg,
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(log),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                "start",
            ],
            f"starting PostgreSQL (log: {log})",
        )
    _create_database(home, dbname)
    return dsn_for(home, dbname)


def _create_database(home: Path, dbname: str) -> None:
    import psycopg

    deadline = time.monotonic() + 30
    while True:
        try:
            with psycopg.connect(dsn_for(home, "postgres"), autocommit=True) as conn:
                exists = conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)
                ).fetchone()
                if not exists:
                    conn.execute(f'CREATE DATABASE "{dbname}"')
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def is_running(base: Path) -> bool:
    """Whether the cluster at `base` exists and its server is running."""
    data = cluster_home(base) / "data"
    return (data / "PG_VERSION").exists() and _server_running(data)


def _server_running(data: Path) -> bool:
    status = subprocess.run(
        [*_as_server_user(), str(find_bindir() / "pg_ctl"), "-D", str(data), "status"],
        capture_output=True,
    )
    return status.returncode == 0


def stop(base: Path) -> None:
    """Stop the cluster at `base` if it is running."""
    home = cluster_home(base)
    data = home / "data"
    if not (data / "PG_VERSION").exists():
        return
    subprocess.run(
        [
            *_as_server_user(),
            str(find_bindir() / "pg_ctl"),
            "-D",
            str(data),
            "-m",
            "fast",
            "-w",
            "stop",
        ],
        capture_output=True,
    )


def destroy(base: Path) -> None:
    """Stop the cluster at `base` and delete its files (throwaway test clusters)."""
    import shutil as _shutil

    stop(base)
    home = cluster_home(base)
    _shutil.rmtree(home, ignore_errors=True)
    link = base.resolve() / "cluster"
    if link.is_symlink():
        link.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pepsi_dispatch.devtools.embedded")
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--dbname", default="pepsi")
    parser.add_argument("--fast", action="store_true", help="fsync off (tests only)")
    args = parser.parse_args(argv)
    try:
        if args.action == "start":
            print(start(args.dir, args.dbname, fast=args.fast))
        else:
            stop(args.dir)
    except EmbeddedError as exc:
        print(f"pepsi embedded cluster: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
