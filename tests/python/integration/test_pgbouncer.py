"""Workers through a real PgBouncer in transaction mode; the dispatcher's check of its own DSN.

A PgBouncer (Debian's ``pgbouncer``; ``make system-deps`` installs it) runs on a
free loopback port in front of the test cluster with two server connections
per database, fewer than the workers that use it. A pipeline of three stages,
each in another language, runs with ``WORKER_DSN`` pointing at it: the Python
SDK, Node with node-postgres (installed from npm into a temporary directory
when not found; only that stage is left out, with the reason, when it cannot
be), and bash + psql with the SQL docs/WORKERS.md documents. One message
crashes its SDK worker mid-transaction, one fails once at each stage and
succeeds on its automatic retry. Every stage records a run in ``pool_ran`` in
the same transaction as the row's transition, under a primary key on
(message, stage): a transition committed twice would fail its message.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dispatch_harness import DISPATCH, PYTHON, WORKERS, wait_until
from dispatch_harness import harness_fixture as harness_fixture
from pooler import (
    POOL_SIZE,
    Bouncer,
    pgbouncer_binary,
    pgbouncer_version,
    running_pgbouncer,
)

from pepsi_dispatch.pooling import behind_pooler
from pepsi_dispatch.sdk.connection import connector

if pgbouncer_binary() is None:
    pytest.skip(
        "pgbouncer is not installed (make system-deps installs it as root on Debian;"
        " else: apt-get install pgbouncer)",
        allow_module_level=True,
    )

RAN = (
    "CREATE TABLE public.pool_ran (id bigint, stage text, retries int, worker_pid int,"
    " backend_pid int, PRIMARY KEY (id, stage))"
)
#: Messages that only move on: enough for each SDK worker to run its statements
#: more often than psycopg's prepare_threshold (5), several workers at once.
PLAIN = 60


@pytest.fixture(scope="module")
def bouncer(pg_admin_dsn: str) -> Iterator[Bouncer]:
    """PgBouncer in transaction mode in front of the test cluster."""
    with running_pgbouncer(pg_admin_dsn, "transaction") as running:
        yield running


@pytest.fixture(scope="module")
def node_pg(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str] | str:
    """The environment under which ``node`` finds node-postgres (``pg``), or why not."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None:
        return "node is not installed"
    if _requires_pg(node, {}):
        return {}
    if npm is None:
        return "node cannot require('pg') and npm is not installed"
    prefix = tmp_path_factory.mktemp("node-pg")
    cmd = [npm, "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(prefix), "pg"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "npm install pg took more than 300 s"
    env = {"NODE_PATH": str(prefix / "node_modules")}
    if done.returncode != 0 or not _requires_pg(node, env):
        return f"npm install pg failed: {' '.join((done.stderr or done.stdout).split())[:300]}"
    return env


def _requires_pg(node: str, env: dict[str, str]) -> bool:
    run = subprocess.run(
        [node, "-e", "require('pg')"], env={**os.environ, **env}, capture_output=True, timeout=60
    )
    return run.returncode == 0


def _stages(node_pg: dict[str, str] | str) -> dict[str, dict[str, Any]]:
    """py (SDK) -> js (Node, when node-postgres is there) -> sh (bash + psql)."""
    retry = {"MAX_RETRIES": "1", "RETRY_DELAY": "100 ms"}
    after_py = "js" if isinstance(node_pg, dict) else "sh"
    stages: dict[str, dict[str, Any]] = {
        "py": {
            "PROGRAM": f"{PYTHON} {WORKERS / 'pooled_sdk_stage.py'} --next {after_py}",
            "NEXT": after_py,
            "PARALLELISM": "3",
            "QUEUE_LIMIT": "2",
            **retry,
        }
    }
    if isinstance(node_pg, dict):
        stages["js"] = {
            "PROGRAM": f"node {WORKERS / 'pooled_node_stage.js'} sh",
            "NEXT": "sh",
            "PARALLELISM": "2",
            **retry,
        }
    stages["sh"] = {
        "PROGRAM": f"/bin/bash {WORKERS / 'pooled_shell_stage.sh'}",
        "PARALLELISM": "2",
        **retry,
    }
    return stages


def test_pipeline_of_three_languages_through_pgbouncer_in_transaction_mode(
    h: Any, bouncer: Bouncer, node_pg: dict[str, str] | str
) -> None:
    """Every message ends as expected, each stage committed once per message, and the
    workers shared the pooler's few server connections."""
    if isinstance(node_pg, str):
        warnings.warn(f"the Node stage is left out: {node_pg}", stacklevel=1)
    h.conn.execute(RAN)
    dbname = h.conn.info.dbname
    stages = _stages(node_pg)
    conf = h.conf(stages, worker_dsn=bouncer.dsn(dbname))
    h.start(conf, env=node_pg if isinstance(node_pg, dict) else None)
    crash = h.enqueue("py", [{"crash": True}])[0]
    flaky = {s: h.enqueue("py", [{"flaky": s}])[0] for s in stages}
    plain = h.enqueue("py", PLAIN)
    seen = {"clients": 0, "servers": 0}

    def finished() -> bool:
        seen["clients"] = max(seen["clients"], bouncer.count("CLIENTS", dbname))
        seen["servers"] = max(seen["servers"], bouncer.count("SERVERS", dbname))
        left = h.conn.execute(
            "SELECT count(*) FROM pepsi.messages WHERE status NOT IN ('done', 'failed')"
        ).fetchone()[0]
        return left == 0

    wait_until(finished, 180, 0.2, lambda: f"every message ended: {h.counts()}\n" + _tails(h))
    assert "prepared statement" not in h.dispatchers[0].log()
    _assert_outcomes(h, list(stages), crash, flaky, plain)
    assert seen["servers"] <= POOL_SIZE < seen["clients"], (
        pgbouncer_version(pgbouncer_binary()),
        seen,
    )


def _assert_outcomes(
    h: Any, stages: list[str], crash: int, flaky: dict[str, int], plain: list[int]
) -> None:
    """The crash failed alone with its exit named; everything else is done, each stage
    committed once, retried exactly where its payload said."""
    crashed = h.row(crash)
    assert crashed["status"] == "failed", crashed
    assert "worker exited with code 3" in crashed["state"].get("dispatch_error", ""), crashed
    statuses = dict(h.conn.execute("SELECT workqueue_id, status FROM pepsi.messages").fetchall())
    assert {i: statuses[i] for i in [*flaky.values(), *plain]} == dict.fromkeys(
        [*flaky.values(), *plain], "done"
    )
    ran = {
        (i, s): r
        for i, s, r in h.conn.execute("SELECT id, stage, retries FROM public.pool_ran").fetchall()
    }
    expected = {(i, s): 0 for i in plain for s in stages}
    for stage, i in flaky.items():
        expected.update({(i, s): int(s == stage) for s in stages})
    assert ran == expected


def _tails(h: Any) -> str:
    return "\n".join(d.tail(30) for d in h.dispatchers)


def test_sdk_connection_through_pgbouncer_prepares_nothing(dsn: str, bouncer: Bouncer) -> None:
    """The SDK's connection knows it is behind a pooler and prepares no statement, so
    two workers that run one statement many times, interleaved over the pool's
    server connections, never find a prepared statement missing or taken; a
    direct connection keeps psycopg's automatic preparing."""
    dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    connect = connector(bouncer.dsn(dbname), "py")
    with connect() as one, connect() as two:
        assert (one.prepare_threshold, two.prepare_threshold) == (None, None)
        for n in range(20):
            for conn in (one, two):
                assert conn.execute("SELECT %s::int + 1", (n,)).fetchone() == (n + 1,)
    with connector(dsn, "py")() as direct:
        assert not behind_pooler(direct)
        assert direct.prepare_threshold == 5


def _check(conf: Path, dsn: str) -> tuple[int, str]:
    """``serve --check`` with ``dsn`` as the dispatcher's own: its exit code, and
    its line about the session."""
    done = subprocess.run(
        [str(DISPATCH), "-c", str(conf), "serve", "--check"],
        env={**os.environ, "PEPSI_DSN": dsn},
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in (done.stdout + done.stderr).splitlines() if " session: " in line]
    assert len(lines) == 1, done.stdout + done.stderr
    return done.returncode, lines[0]


def test_check_says_when_the_dispatcher_dsn_goes_through_a_transaction_pooler(
    h: Any, bouncer: Bouncer, pg_admin_dsn: str
) -> None:
    """``serve --check`` fails, saying what to do, when the dispatcher's DSN goes
    through PgBouncer in transaction mode; it passes with the DSN direct (the
    pooler then serves WORKER_DSN alone, which the check notes), and through
    PgBouncer in session mode."""
    dbname = h.conn.info.dbname
    conf = h.conf({"a": {"PROGRAM": "/bin/cat"}}, worker_dsn=bouncer.dsn(dbname))
    code, line = _check(conf, bouncer.dsn(dbname))
    assert code == 2 and line.startswith("FAIL session: "), line
    assert "pooler in transaction (or statement) mode" in line, line
    assert "directly" in line and "WORKER_DSN" in line, line
    code, line = _check(conf, h.dsn)
    assert (code, line) == (
        0,
        "ok   session: a PostgreSQL session of its own (no pooler in between)",
    )
    with running_pgbouncer(pg_admin_dsn, "session") as session_mode:
        code, line = _check(conf, session_mode.dsn(dbname))
    assert code == 0 and line.startswith("ok   session: ") and "session mode" in line, line


def test_serve_refuses_a_dispatcher_dsn_through_a_transaction_pooler(
    h: Any, bouncer: Bouncer
) -> None:
    """``serve`` itself refuses (exit 2, what and how to fix) to start on a DSN
    that goes through PgBouncer in transaction mode, before it takes the
    database: its advisory lock would sit in a server session the pooler lends
    to others, a second dispatcher would start beside it, and the pooler would
    keep the lock after both had gone. Nothing is registered or locked."""
    dbname = h.conn.info.dbname
    conf = h.conf({"a": {"PROGRAM": "/bin/cat"}})
    done = subprocess.run(
        [str(DISPATCH), "-c", str(conf), "serve"],
        env={**os.environ, "PEPSI_DSN": bouncer.dsn(dbname)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "pooler in transaction (or statement) mode" in out and "directly" in out, out
    assert h.conn.execute("SELECT count(*) FROM pepsi.dispatchers").fetchone()[0] == 0
    held = h.conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchone()
    assert held[0] == 0, "no lock left behind in a pooled server session"
