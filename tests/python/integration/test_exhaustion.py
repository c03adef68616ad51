"""Resource exhaustion: the dispatcher at its open-file limit, its log file on a full
filesystem, PostgreSQL at max_connections. Each: a clear log line, no crash (loop),
nothing lost. Real processes, real limits (prlimit, a small tmpfs, a throwaway
cluster); each test takes a few seconds.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dispatch_harness import Harness, harness_fixture, wait_until  # noqa: F401

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (prlimit, mount)")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@ROOT_ONLY
def test_the_dispatcher_at_its_open_file_limit_keeps_serving(h: Harness) -> None:
    """Spawning a worker needs pipes; at the open-file limit that fails with EMFILE.
    The stage is held off with a log line saying why, the workers that did start
    serve, and once descriptors are free again every message is done."""
    conf = h.conf(h.pipeline(["a"], PARALLELISM=4, QUEUE_LIMIT=1))
    d = h.start(conf)
    n = open_fds(d.pid)
    # Room for about one worker (its three pipe ends, plus the spawn's own pipes).
    _soft, hard = resource.prlimit(d.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(d.pid, resource.RLIMIT_NOFILE, (n + 9, hard))
    ids = h.enqueue("a", [{"sleep": 0.05}] * 40)
    wait_until(
        lambda: "Too many open files" in d.log() or not d.running(),
        20,
        0.1,
        lambda: "EMFILE at a spawn\n" + d.tail(),
    )
    assert d.running(), d.tail()
    line = next(ln for ln in d.log().splitlines() if "Too many open files" in ln)
    assert "WARNING" in line or "ERROR" in line, line
    resource.prlimit(d.pid, resource.RLIMIT_NOFILE, (_soft, hard))
    h.wait_all(where=f"workqueue_id <= {max(ids)}", timeout=60)
    assert [h.row(i)["status"] for i in ids] == ["done"] * len(ids)
    assert d.running() and d.terminate() == 0


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MB tmpfs, unmounted afterwards."""
    mnt = tmp_path / "smallfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(fs: Path) -> Path:
    """Fill ``fs`` to the last block; returns the filler file."""
    filler = fs / "filler"
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={filler}", "bs=4k"], capture_output=True, check=False
    )
    return filler


@ROOT_ONLY
def test_a_full_log_filesystem_never_stops_the_dispatcher(h: Harness, small_fs: Path) -> None:
    """-l LOGFILE on a filesystem that fills up: one line on stderr says so, log lines
    are dropped and counted, every message is still done, and once space returns the
    file says how many lines were lost."""
    logfile = small_fs / "dispatch.log"
    conf = h.conf(h.pipeline(["a", "b"]))
    d = h.start(conf, args=["-l", str(logfile)], level="DEBUG")  # DEBUG: many lines
    filler = fill(small_fs)
    ids = h.enqueue("a", 30)
    h.wait_all(where=f"workqueue_id <= {max(ids)}", timeout=60)
    assert [h.row(i)["status"] for i in ids] == ["done"] * len(ids)
    assert d.running()
    stderr = d.log()  # the harness captures stdout and stderr
    assert f"log file {logfile}: cannot write (No space left on device)" in stderr, stderr
    assert stderr.count("cannot write") == 1 and "Traceback" not in stderr, stderr
    filler.unlink()
    more = h.enqueue("a", 3)
    h.wait_all(where=f"workqueue_id <= {max(more)}", timeout=30)
    wait_until(lambda: "dropped while it could not be written" in logfile.read_text(), 10)
    assert "written again" in d.log()
    assert d.terminate() == 0


@pytest.fixture
def small_cluster() -> Iterator[str]:
    """A throwaway cluster (pepsi_dispatch.devtools.embedded) with max_connections 8,
    migrated to head; its DSN. Stopped and removed afterwards."""
    import shutil
    import uuid

    from pepsi_dispatch.devtools import embedded

    base = Path(f"/tmp/pepsi-maxconn-{uuid.uuid4().hex[:8]}")
    try:
        dsn = embedded.start(base, "pepsi", fast=True)
        home = embedded.cluster_home(base)
        pg_ctl = str(embedded.find_bindir() / "pg_ctl")
        options = (
            f"-k {home / 'run'} -c listen_addresses='' -c max_connections=8"
            " -c superuser_reserved_connections=0 -c fsync=off"
        )
        subprocess.run(
            [*embedded._as_server_user(), pg_ctl, "-D", str(home / "data"), "-l",
             str(home / "postgres.log"), "-o", options, "-w", "restart"],
            check=True, capture_output=True,
        )  # fmt: skip
        root = Path(__file__).resolve().parents[3]
        subprocess.run(
            [sys.executable, "-m", "alembic", "upgrade", "head"],
            cwd=root, env={**os.environ, "PEPSI_DSN": dsn}, check=True, capture_output=True,
        )  # fmt: skip
        yield dsn
    finally:
        embedded.stop(base)
        shutil.rmtree(embedded.cluster_home(base), ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)


@ROOT_ONLY
def test_workers_at_postgres_max_connections_lose_nothing(h: Harness, small_cluster: str) -> None:
    """max_connections 8: the dispatcher holds a few, so most of a stage's 6 workers
    are refused ('too many clients already'). Their stderr says so in the dispatcher's
    log; the workers that connected do the work; nothing is lost, nothing crash-loops."""
    import psycopg

    conf = h.conf(h.pipeline(["a"], PARALLELISM=6, QUEUE_LIMIT=1), db_pool_size=1)
    d = h.start(conf, dsn=small_cluster)
    with psycopg.connect(small_cluster, autocommit=True) as conn:
        ids = [
            r[0]
            for r in conn.execute(
                "SELECT pepsi.enqueue('a', jsonb_build_object('sleep', 0.05))"
                " FROM generate_series(1, 60)"
            ).fetchall()
        ]

        def all_done() -> bool:
            n = conn.execute(
                "SELECT count(*) FROM pepsi.messages WHERE status = 'done'"
                " AND workqueue_id = ANY(%s)",
                (ids,),
            ).fetchone()[0]
            return n == len(ids) or not d.running()

        wait_until(all_done, 60, 0.2, lambda: "all done\n" + d.tail())
        assert d.running(), d.tail()
        statuses = conn.execute("SELECT status, count(*) FROM pepsi.messages GROUP BY 1").fetchall()
    assert statuses == [("done", 60)], statuses
    assert "too many clients already" in d.log(), d.tail()
    assert d.terminate() == 0


def _pg(cmd: list[str], **kw: object) -> subprocess.CompletedProcess:
    from pepsi_dispatch.devtools import embedded

    return subprocess.run([*embedded._as_server_user(), *cmd], capture_output=True, text=True, **kw)


@ROOT_ONLY
def test_postgres_wal_disk_full_stops_the_server_and_loses_nothing(h: Harness) -> None:
    """pg_wal on a small tmpfs that fills up: PostgreSQL PANICs and stops. The
    dispatcher waits, reconnecting with backoff (no crash loop). Once space returns
    and the server is started again, every message whose enqueue committed is there
    and gets done."""
    import shutil
    import uuid

    import psycopg

    from pepsi_dispatch.devtools import embedded

    bindir = embedded.find_bindir()
    home = Path(f"/tmp/pepsi-walfull-{uuid.uuid4().hex[:8]}")
    wal_fs, data, run = home / "walfs", home / "data", home / "run"
    for p in (home, wal_fs, run):
        p.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(wal_fs)], check=True)
    d = None
    try:
        for p in (home, wal_fs, run):
            shutil.chown(p, "postgres", "postgres")
        r = _pg([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                 "--no-sync", "--waldir", str(wal_fs / "wal"), "--wal-segsize", "1"])  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        log = home / "postgres.log"
        options = (
            f"-k {run} -c listen_addresses='' -c min_wal_size=2MB -c max_wal_size=8MB"
            # wal_keep_size: a checkpoint neither removes nor recycles a segment, so
            # the WAL only grows and must outgrow the tmpfs (with recycling it could
            # run on in the segments it already has, and the server never fills up).
            " -c wal_keep_size=1GB -c restart_after_crash=off"
        )
        start = [str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options,
                 "-w", "-t", "30", "start"]  # fmt: skip
        assert _pg(start).returncode == 0, log.read_text()
        admin = f"postgresql:///postgres?host={run}&user=postgres"
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute("CREATE DATABASE pepsi")
        dsn = f"postgresql:///pepsi?host={run}&user=postgres"
        root = Path(__file__).resolve().parents[3]
        subprocess.run(
            [sys.executable, "-m", "alembic", "upgrade", "head"],
            cwd=root, env={**os.environ, "PEPSI_DSN": dsn}, check=True, capture_output=True,
        )  # fmt: skip
        d = h.start(h.conf(h.pipeline(["a"])), dsn=dsn)
        conn = psycopg.connect(dsn, autocommit=True)
        # 4,000 random hex characters: pglz cannot shrink them, so each row writes its
        # whole pad to the WAL (repeat('x', 4000) would compress to almost nothing).
        enqueue = (
            "SELECT pepsi.enqueue('a', jsonb_build_object('pad', ("
            "SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 125))))"
            " FROM generate_series(1, 20)"
        )
        # One batch before the fill, so that some committed messages are at stake
        # however much room the WAL segments already made have left after it.
        committed: list[int] = [r[0] for r in conn.execute(enqueue).fetchall()]
        fill(wal_fs)
        deadline = time.monotonic() + 120
        with pytest.raises(psycopg.OperationalError):
            # ~80 kB of WAL a batch, 24 MB of room at most: a few hundred batches.
            while time.monotonic() < deadline:
                committed += [r[0] for r in conn.execute(enqueue).fetchall()]
        conn.close()
        assert "No space left on device" in log.read_text(), log.read_text()[-2000:]
        wait_until(
            lambda: _pg([str(bindir / "pg_ctl"), "-D", str(data), "status"]).returncode != 0,
            30, 0.2, "the server to stop",
        )  # fmt: skip
        assert d.running(), d.tail()  # waiting for the database, not crashed
        (wal_fs / "filler").unlink()
        assert _pg(start).returncode == 0, log.read_text()[-2000:]
        assert committed, "nothing committed before the disk filled"
        with psycopg.connect(dsn, autocommit=True) as c:
            present = {
                r[0]
                for r in c.execute(
                    "SELECT workqueue_id FROM pepsi.messages WHERE workqueue_id = ANY(%s)",
                    (committed,),
                ).fetchall()
            }
            assert present == set(committed)

            def done() -> bool:
                n = c.execute(
                    "SELECT count(*) FROM pepsi.messages WHERE status = 'done'"
                    " AND workqueue_id = ANY(%s)",
                    (committed,),
                ).fetchone()[0]
                return n == len(committed) or not d.running()

            wait_until(done, 60, 0.3, lambda: "all done after the restart\n" + d.tail())
        assert d.running(), d.tail()
        assert d.terminate() == 0
    finally:
        if d is not None and d.running():
            d.kill9()
        _pg([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"])
        subprocess.run(["umount", "-l", str(wal_fs)], check=False)
        shutil.rmtree(home, ignore_errors=True)
