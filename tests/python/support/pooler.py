"""A real PgBouncer for tests: started on a free loopback port in front of the test
cluster, in a pool mode of the test's choosing, with a small pool so that its
clients really share server connections.

PgBouncer refuses to run as root: as root it runs as the ``postgres`` account
(the one the throwaway cluster runs as). Authentication is ``trust`` with an
``auth_file`` naming the test DSN's user (and password, when it has one, which
PgBouncer then also uses to log in to PostgreSQL).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from dispatch_harness import wait_until
from psycopg.conninfo import conninfo_to_dict

#: Server connections per (database, user) pair: fewer than the test's clients.
POOL_SIZE = 2


def pgbouncer_binary() -> str | None:
    """The pgbouncer executable (Debian installs it in /usr/sbin), or None."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    for path in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer", "/usr/local/bin/pgbouncer"):
        if os.access(path, os.X_OK):
            return path
    return None


def pgbouncer_version(binary: str) -> str:
    """``PgBouncer 1.18.0`` and the like: the first line of ``pgbouncer --version``."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    return (out.stdout or out.stderr).splitlines()[0].strip()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Bouncer:
    """A running PgBouncer: where it listens, and how to reach its admin console."""

    port: int
    user: str
    password: str | None
    proc: subprocess.Popen[bytes]
    log: Path

    def dsn(self, dbname: str) -> str:
        """A URI for ``dbname`` through the pooler (the form every driver reads)."""
        secret = f":{self.password}" if self.password else ""
        return f"postgresql://{self.user}{secret}@127.0.0.1:{self.port}/{dbname}"

    def admin(self, command: str) -> list[dict[str, Any]]:
        """A ``SHOW`` command on PgBouncer's admin console, as rows of dicts."""
        with psycopg.connect(self.dsn("pgbouncer"), autocommit=True) as conn:
            cur = conn.execute(command)
            names = [c.name for c in cur.description or []]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def count(self, what: str, dbname: str) -> int:
        """How many ``CLIENTS`` or ``SERVERS`` PgBouncer has for ``dbname`` now."""
        return sum(1 for row in self.admin(f"SHOW {what}") if row["database"] == dbname)


def _config(server: dict[str, Any], port: int, pool_mode: str, home: Path) -> str:
    """The pgbouncer.ini: every database forwarded to the test cluster."""
    host = server.get("host") or "/var/run/postgresql"
    target = f"host={host} port={server.get('port') or 5432}"
    return "\n".join(
        [
            "[databases]",
            f"* = {target}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {home / 'users.txt'}",
            f"admin_users = {server.get('user') or 'postgres'}",
            f"pool_mode = {pool_mode}",
            f"default_pool_size = {POOL_SIZE}",
            "max_client_conn = 200",
            f"logfile = {home / 'pgbouncer.log'}",
            f"pidfile = {home / 'pgbouncer.pid'}",
            "",
        ]
    )


def _as_postgres_when_root(home: Path) -> dict[str, Any]:
    """Popen arguments that run PgBouncer as ``postgres`` when we are root."""
    if os.geteuid() != 0:
        return {}
    account = pwd.getpwnam("postgres")
    for path in (home, *home.iterdir()):
        os.chown(path, account.pw_uid, account.pw_gid)
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


@contextmanager
def running_pgbouncer(admin_dsn: str, pool_mode: str = "transaction") -> Iterator[Bouncer]:
    """A PgBouncer in ``pool_mode`` in front of ``admin_dsn``'s cluster, stopped on exit."""
    binary = pgbouncer_binary()
    assert binary is not None, "pgbouncer not found"
    server = conninfo_to_dict(admin_dsn)
    user, password = str(server.get("user") or "postgres"), server.get("password")
    home = Path(tempfile.mkdtemp(prefix="pepsi-pgbouncer-", dir="/tmp"))
    home.chmod(0o755)
    (home / "users.txt").write_text(f'"{user}" "{password or ""}"\n')
    port = free_port()
    (home / "pgbouncer.ini").write_text(_config(server, port, pool_mode, home))
    proc = subprocess.Popen(
        [binary, str(home / "pgbouncer.ini")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        **_as_postgres_when_root(home),
    )
    bouncer = Bouncer(port, user, str(password) if password else None, proc, home / "pgbouncer.log")
    try:
        wait_until(lambda: _answers(bouncer), 30, 0.1, lambda: f"pgbouncer up: {_log(bouncer)}")
        yield bouncer
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(home, ignore_errors=True)


def _answers(bouncer: Bouncer) -> bool:
    """True once the admin console answers; raises when PgBouncer has exited."""
    if bouncer.proc.poll() is not None:
        raise AssertionError(f"pgbouncer exited {bouncer.proc.returncode}: {_log(bouncer)}")
    try:
        bouncer.admin("SHOW VERSION")
    except psycopg.OperationalError:
        return False
    return True


def _log(bouncer: Bouncer) -> str:
    try:
        return bouncer.log.read_text(errors="replace")[-2000:]
    except OSError:
        return "(no log)"
