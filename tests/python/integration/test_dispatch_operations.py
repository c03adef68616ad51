"""The real dispatcher, operator-facing: how workers are started, retention of done
rows, and the privilege drop to SERVICE_USER when started as root.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from dispatch_harness import (  # noqa: F401
    SHELL,
    Harness,
    harness_fixture,
    proc_cmdline,
    proc_env,
    wait_until,
)
from psycopg.conninfo import make_conninfo


def test_worker_invocation_env_and_config_file(h: Harness) -> None:
    stages = h.pipeline(["a"], PARALLELISM=1)
    plain = h.start(h.conf(stages, name="plain.conf"))
    did = plain.dispatcher_id(h.conn)
    h.enqueue("a", [{"do": "sleep:1;next"}])
    workers = wait_until(lambda: plain.workers().get("a"), 20, message="a worker")
    env = proc_env(workers[0])
    assert env["PEPSI_STAGE"] == "a"
    assert env["PEPSI_DSN"] == h.dsn
    assert env["PEPSI_DISPATCHER_ID"] == str(did)
    argv = proc_cmdline(workers[0])
    assert argv[-1] == "worker" and "-c" not in argv, argv
    h.wait_all("done", timeout=30)
    assert plain.terminate() == 0

    # with CONFIG_FILE set, the worker gets "-c CONFIG_FILE" before "worker"
    extra = h.tmp / "stage-programs.conf"
    extra.write_text("[docpipe]\nX = 1\n")
    with_c = h.start(h.conf(stages, name="with-c.conf", CONFIG_FILE=str(extra)))
    h.enqueue("a", [{"do": "sleep:1;next"}])
    workers = wait_until(lambda: with_c.workers().get("a"), 20, message="a worker")
    argv = proc_cmdline(workers[0])
    assert argv[-3:] == ["-c", str(extra), "worker"], argv
    h.wait_all("done", timeout=30)
    assert with_c.terminate() == 0


def test_retention_purges_old_done_rows(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a"]), RETENTION="1 s", POLL_INTERVAL="1 s"))
    done = h.enqueue("a", 20)
    failed = h.enqueue("a", [{"do": "fail"}])
    h.wait_all(timeout=30)
    wait_until(
        lambda: (
            h.conn.execute(
                "SELECT count(*) FROM pepsi.messages WHERE workqueue_id = ANY(%s)", (done,)
            ).fetchone()[0]
            == 0
        ),
        20,
        message=lambda: f"done rows purged: {h.counts()}",
    )
    assert h.row(failed[0])["status"] == "failed"  # failed rows stay
    assert d.terminate() == 0


def test_retention_zero_keeps_done_rows(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a"]), RETENTION="0", POLL_INTERVAL="1 s"))
    h.enqueue("a", 5)
    h.wait_all(timeout=30)
    h.conn.execute("UPDATE pepsi.workqueue SET updated_at = now() - interval '30 days'")
    time.sleep(3.5)  # three heartbeats later nothing is gone
    assert h.counts() == {"done": 5}
    assert d.terminate() == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="the privilege drop needs root")
def test_root_drops_to_service_user(h: Harness) -> None:
    """Started as root with SERVICE_USER = postgres: dispatcher and workers run as postgres
    (groups included). The shell worker (bash + psql) needs nothing readable only by root."""
    try:
        pw = pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("no 'postgres' account to drop to")
    # configuration readable by the service user (reload re-reads it after the drop)
    home = Path(tempfile.mkdtemp(prefix="pepsi-priv-", dir="/tmp"))
    try:
        os.chmod(home, 0o755)
        prog = f"/bin/bash {SHELL}"
        conf = home / "pepsi.conf"
        shutil.copy(h.conf({"a": {"PROGRAM": prog}}, SERVICE_USER="postgres"), conf)
        os.chmod(conf, 0o644)
        d = h.start(conf)
        status = Path(f"/proc/{d.pid}/status").read_text()
        uids = next(ln for ln in status.splitlines() if ln.startswith("Uid:")).split()[1:]
        assert uids == [str(pw.pw_uid)] * 4, status
        groups = next(ln for ln in status.splitlines() if ln.startswith("Groups:")).split()[1:]
        assert sorted(int(g) for g in groups) == sorted(os.getgrouplist("postgres", pw.pw_gid))
        h.enqueue("a", 5)
        h.wait_all("done", timeout=30)
        workers = wait_until(lambda: d.workers().get("a"), 5, message="an idle worker")
        for pid in workers:
            wstatus = Path(f"/proc/{pid}/status").read_text()
            wuids = next(ln for ln in wstatus.splitlines() if ln.startswith("Uid:")).split()[1:]
            assert wuids == [str(pw.pw_uid)] * 4, wstatus
        # reload after the drop still finds and reads the file
        h.set_config("stage-a", "PARALLELISM", "2")
        h.enqueue("a", 3)
        h.wait_all("done", timeout=30)
        assert d.running(), d.tail()
        assert d.terminate() == 0
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_bad_graph_in_file_refused_with_one_line(h: Harness) -> None:
    conf = h.conf({"a": {"PROGRAM": h.program(), "NEXT": "ghost"}})
    d = h.start(conf, wait=False)
    assert d.wait_exit(30) == 2
    lines = [ln for ln in d.log().splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert "ghost" in lines[0] and str(conf) in lines[0], lines[0]
    assert "Traceback" not in d.log()


def test_unmigrated_database_refused_with_one_line(h: Harness, empty_dsn: str) -> None:
    d = h.start(h.conf(h.pipeline(["a"])), wait=False, dsn=empty_dsn)
    rc = d.wait_exit(30)
    assert rc in (1, 2), d.log()
    lines = [ln for ln in d.log().splitlines() if ln.strip() and "WARNING" not in ln]
    assert len(lines) == 1, lines
    assert "Traceback" not in d.log()
    # a clear line says what to do, like the worker SDK's -- and names the
    # command an installed wheel has (no alembic.ini outside a checkout)
    assert re.search(r"migrat|alembic", lines[0], re.I), lines[0]
    assert rc == 2 and "run 'pepsi-queue migrate'" in lines[0], lines[0]


def test_processing_seconds_plausible(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=4)))
    h.enqueue("a", [{"do": "sleep:0.3;next"} for _ in range(8)])
    h.wait_all("done", timeout=30)
    ss = wait_until(
        lambda: h.stage_stats().get("a", {}).get("processed") == 8 and h.stage_stats(),
        10,
        message=lambda: str(h.stage_stats()),
    )
    secs = ss["a"]["processing_seconds"]
    # The dispatcher starts a pipelined message's clock when it reads the previous
    # answer, a few ms after the worker already started it: allow 50 ms each.
    assert 8 * 0.25 <= secs <= 8 * 0.3 + 3, f"processing_seconds {secs} for 8 x 0.3 s"
    assert d.terminate() == 0


@pytest.fixture
def outsider(pg_admin_dsn: str) -> Iterator[str]:
    """A login role in no pepsi role (cluster-wide: dropped afterwards)."""
    name = f"pepsi_x_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'x'")
    yield name
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
        )
        admin.execute(f"DROP ROLE IF EXISTS {name}")


def test_a_role_that_may_not_dispatch_is_a_configuration_error(h: Harness, outsider: str) -> None:
    # It was exit 1 with "database error during start-up: permission denied for
    # schema pepsi LINE 1: SELECT ... ^": the statement, no hint.
    dsn = make_conninfo(h.dsn, user=outsider, password="x")
    d = h.start(h.conf(h.pipeline(["a"])), wait=False, dsn=dsn)
    assert d.wait_exit(30) == 2, d.log()
    lines = [ln for ln in d.log().splitlines() if ln.strip() and "WARNING" not in ln]
    assert len(lines) == 1, lines
    assert f"role {outsider} may not dispatch" in lines[0], lines[0]
    assert f"GRANT pepsi_dispatcher TO {outsider}" in lines[0] and "LINE 1" not in lines[0]
