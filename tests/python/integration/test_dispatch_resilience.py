"""The real dispatcher against database trouble and beside other replicas:
a PostgreSQL restart under load (own throwaway cluster), and competing mode.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from conftest import alembic
from dispatch_harness import (  # noqa: F401
    Harness,
    children_of,
    harness_fixture,
    pid_alive,
    wait_until,
)

from pepsi_dispatch.devtools import embedded


def running_rows(h: Harness, dispatcher_id: int | None = None) -> int:
    if dispatcher_id is None:
        sql, args = "SELECT count(*) FROM pepsi.messages WHERE status = 'running'", ()
    else:
        sql = "SELECT count(*) FROM pepsi.messages WHERE status = 'running' AND dispatcher_id = %s"
        args = (dispatcher_id,)
    return h.conn.execute(sql, args).fetchone()[0]


@pytest.fixture
def own_cluster() -> Iterator[tuple[Path, str]]:
    base = Path(tempfile.mkdtemp(prefix="pepsi-restart-", dir="/tmp"))
    try:
        dsn = embedded.start(base, "pepsi", fast=True)
        alembic(dsn, "upgrade", "head")
        yield base, dsn
    finally:
        embedded.destroy(base)
        shutil.rmtree(base, ignore_errors=True)


def pg_restart(base: Path) -> None:
    home = embedded.cluster_home(base)
    cmd = [
        *embedded._as_server_user(),
        str(embedded.find_bindir() / "pg_ctl"),
        "-D", str(home / "data"), "-l", str(home / "postgres.log"),
        "-m", "fast", "-w", "-t", "60", "restart",
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_postgres_restart_under_load_loses_nothing(
    own_cluster: tuple[Path, str], tmp_path: Path
) -> None:
    base, dsn = own_cluster
    h = Harness(tmp_path, dsn)
    try:
        conf = h.conf(h.pipeline(["a", "b"], PARALLELISM=2, QUEUE_LIMIT=4))
        d = h.start(conf)
        n = 400
        h.enqueue("a", [{"do": "sleep:0.01;next"} for _ in range(n)])
        wait_until(lambda: h.counts().get("done", 0) >= 40, 60, message="progress before restart")
        t0 = time.monotonic()
        pg_restart(base)
        restart_s = time.monotonic() - t0
        h.conn = psycopg.connect(dsn, autocommit=True)
        assert d.running(), d.tail()
        counts = h.wait_all(timeout=120)
        assert counts == {"done": n}, counts
        assert d.running(), d.tail()
        # notifications work again (LISTEN renewed): new rows go through without the
        # heartbeat (POLL_INTERVAL is 60 s)
        more = h.enqueue("a", 10)
        h.wait_all("done", timeout=20, where=f"workqueue_id >= {more[0]}")
        assert h.overlaps() == []
        log = d.log().lower()
        assert "reconnect" in log or "connection" in log, d.tail()
        # a restart stops the workers (nothing proves it clean), then all runs on
        assert "worker(s) were stopped" in log, d.tail()
        assert d.terminate() == 0
        print(f"PostgreSQL restart took {restart_s:.2f} s; {n + 10} messages done, none lost")
    finally:
        h.close()


#: The shared statistics' reset time: a crash restart renews it.
STATS_RESET = "SELECT stats_reset::text FROM pg_stat_bgwriter"


def crash_a_backend(dsn: str) -> str:
    """SIGKILL one server process: PostgreSQL then ends every session and
    re-initialises (crash recovery) without a new postmaster. Returns the
    statistics' reset time from before the crash (see connect_when_back)."""
    victim = psycopg.connect(dsn, autocommit=True)
    before = victim.execute(STATS_RESET).fetchone()[0]  # type: ignore[index]
    os.kill(victim.info.backend_pid, signal.SIGKILL)
    return before


def connect_when_back(dsn: str, before: str | None = None) -> psycopg.Connection:
    """A connection once the server takes them again -- after its crash restart
    when ``before`` (crash_a_backend's result) is given: a session opened before
    the postmaster noticed the crash would be ended by the restart."""
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = psycopg.connect(dsn, autocommit=True)
            if before is None or conn.execute(STATS_RESET).fetchone()[0] != before:  # type: ignore[index]
                return conn
            conn.close()
        except psycopg.OperationalError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("the server did not come back from its crash within 60 s")
        time.sleep(0.1)


def test_a_server_crash_stops_the_workers_and_every_message_runs_to_done_once(
    own_cluster: tuple[Path, str], tmp_path: Path
) -> None:
    """Claims commit without waiting for their WAL flush, so a crash may lose the
    last ones: the dispatcher notices the crash restart at reconnect, stops every
    worker (an id never stays with a worker while its row is pending again) and
    carries on."""
    base, dsn = own_cluster
    h = Harness(tmp_path, dsn)
    try:
        conf = h.conf(h.pipeline(["a", "b"], PARALLELISM=2, QUEUE_LIMIT=4))
        d = h.start(conf)
        n = 300
        h.enqueue("a", [{"do": "sleep:0.01;next"} for _ in range(n)])
        wait_until(lambda: h.counts().get("done", 0) >= 30, 60, message="progress before the crash")
        before = crash_a_backend(dsn)
        h.conn = connect_when_back(dsn, before)
        wait_until(
            lambda: "database server restarted" in d.log(), 60, message="the restart noticed"
        )
        counts = h.wait_all(timeout=120)
        assert counts == {"done": n}, counts
        assert d.running(), d.tail()
        assert h.overlaps() == []
        # a second crash is noticed again (the new epoch was kept)
        before = crash_a_backend(dsn)
        h.conn = connect_when_back(dsn, before)
        more = h.enqueue("a", 10)
        h.wait_all("done", timeout=60, where=f"workqueue_id >= {more[0]}")
        assert d.log().count("database server restarted") == 2, d.tail()
        assert d.terminate() == 0
    finally:
        h.close()


def test_a_lost_connection_without_a_server_restart_keeps_the_workers(h: Harness) -> None:
    """Only a server restart stops the workers: a dispatcher whose connections
    were merely cut reconnects and its workers keep their messages."""
    conf = h.conf(h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=1))
    d = h.start(conf)
    (mid,) = h.enqueue("a", [{"do": "sleep:2;finish"}])
    wait_until(lambda: h.counts().get("running", 0) == 1, 30, message="the message running")
    pids = set(children_of(d.pid))
    h.conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name LIKE 'pepsi-dispatch%%'"
    )
    wait_until(lambda: "re-established" in d.log(), 30, message="the reconnect")
    h.wait_all("done", timeout=30, where=f"workqueue_id = {mid}")
    assert "database server restarted" not in d.log(), d.tail()
    assert set(children_of(d.pid)) & pids, (pids, children_of(d.pid))


def competing_conf(h: Harness, stages: list[str], **kw):
    return h.conf(
        h.pipeline(stages, PARALLELISM=2, QUEUE_LIMIT=2),
        COMPETING="YES",
        ORPHAN_TIMEOUT="3 s",
        POLL_INTERVAL="1 s",
        **kw,
    )


def test_competing_replicas_process_each_message_once(h: Harness) -> None:
    conf = competing_conf(h, ["a", "b"])
    n = 300
    ids = h.enqueue("a", [{"do": "sleep:0.01;next"} for _ in range(n)])
    d1 = h.start(conf)
    wait_until(lambda: running_rows(h) > 0, 20, message="first replica working")
    d2 = h.start(conf)  # starts while d1 holds rows: must not reset them
    id1, id2 = d1.dispatcher_id(h.conn), d2.dispatcher_id(h.conn)
    assert id1 != id2
    counts = h.wait_all(timeout=120)
    assert counts == {"done": n}, counts
    log = h.wlog()
    per = Counter((r.wq_id, r.stage) for r in log.runs)
    twice = {k: v for k, v in per.items() if v != 1}
    assert not twice, f"processed more than once: {list(twice.items())[:10]}"
    assert set(per) == {(i, s) for i in ids for s in ("a", "b")}
    by_dispatcher = Counter(log.spawns[r.pid][1] for r in log.runs)
    assert by_dispatcher[str(id1)] > 0 and by_dispatcher[str(id2)] > 0, by_dispatcher
    assert h.overlaps() == []
    assert d1.terminate() == 0 and d2.terminate() == 0
    # both replicas flushed their deltas; the totals add up
    ds = h.dispatch_stats()
    assert ds["messages"] == 2 * n and ds["stage_runs"] == 2 * n, ds
    ss = h.stage_stats()
    assert ss["a"]["processed"] == n and ss["b"]["processed"] == n, ss


def test_competing_killed_replica_rows_reclaimed(h: Harness) -> None:
    conf = competing_conf(h, ["a"])
    d1 = h.start(conf)
    d2 = h.start(conf)
    id1 = d1.dispatcher_id(h.conn)
    n = 40
    h.enqueue("a", [{"do": "sleep:0.3;next"} for _ in range(n)])
    wait_until(lambda: running_rows(h, id1) >= 2, 20, message="the first replica holds rows")
    d1.workers()
    workers = d1.seen_workers | {pid for pid, sp in h.wlog().spawns.items() if sp[1] == str(id1)}
    t_kill = time.monotonic()
    d1.kill9()
    wait_until(
        lambda: not [p for p in workers if pid_alive(p)],
        5,
        message="the killed replica's workers die with it",
    )
    held = (
        h.conn.execute(
            "SELECT array_agg(workqueue_id) FROM pepsi.messages"
            " WHERE status = 'running' AND dispatcher_id = %s",
            (id1,),
        ).fetchone()[0]
        or []
    )
    counts = h.wait_all(timeout=60)
    took = time.monotonic() - t_kill
    assert counts == {"done": n}, counts
    assert d2.running()
    assert h.overlaps() == []
    if held:
        # the orphans were not taken before ORPHAN_TIMEOUT (3 s), and were within ~ +2 heartbeats
        assert took < 3 + 10, f"orphans reclaimed only after {took:.1f} s"
    assert d2.terminate() == 0


def test_dispatcher_connections_killed_under_load(h: Harness) -> None:
    """pg_terminate_backend on every session of the database but ours (dispatcher and
    workers alike) in the middle of a run: reconnect, LISTEN renewed, nothing lost."""
    conf = h.conf(h.pipeline(["a", "b"], PARALLELISM=2, QUEUE_LIMIT=3))
    d = h.start(conf)
    n = 300
    h.enqueue("a", [{"do": "sleep:0.01;next"} for _ in range(n)])
    for _ in range(2):
        before = h.counts().get("done", 0)
        wait_until(lambda before=before: h.counts().get("done", 0) >= before + 30, 60)
        killed = h.conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()[0]
        assert killed >= 1
    counts = h.wait_all(timeout=120)
    assert counts == {"done": n}, counts
    assert d.running(), d.tail()
    more = h.enqueue("a", 10)  # POLL_INTERVAL 60 s: only a renewed LISTEN brings these in
    h.wait_all("done", timeout=20, where=f"workqueue_id >= {more[0]}")
    assert h.overlaps() == []
    assert d.terminate() == 0


def test_answers_during_database_outage_are_not_lost(
    own_cluster: tuple[Path, str], tmp_path: Path
) -> None:
    """PostgreSQL stopped while workers are mid-message: a crash and a normal answer that
    arrive during the outage are settled after the reconnect (the crash's head fails, the
    rest is processed)."""
    base, dsn = own_cluster
    h = Harness(tmp_path, dsn)
    try:
        conf = h.conf(h.pipeline(["a"], PARALLELISM=2, QUEUE_LIMIT=2))
        d = h.start(conf)
        crash, *rest = h.enqueue(
            "a", [{"do": "sleep:1.5;exit:3"}, {}, {"do": "sleep:1.5;next"}, {}]
        )
        wait_until(
            lambda: len({r.wq_id for r in h.wlog().runs}) >= 2, 20, message="both workers busy"
        )
        h.conn.close()
        embedded.stop(base)
        time.sleep(3)  # the crash and the answer happen while the database is down
        embedded.start(base, "pepsi", fast=True)
        h.conn = psycopg.connect(dsn, autocommit=True)
        h.wait_all(timeout=90)
        row = h.row(crash)
        assert row["status"] == "failed", row
        assert "3" in str(row["state"].get("dispatch_error")), row["state"]
        assert [h.row(i)["status"] for i in rest] == ["done"] * 3
        assert d.running(), d.tail()
        assert h.overlaps() == []
        assert d.terminate() == 0
    finally:
        h.close()


def test_competing_stalled_replica_is_fenced(h: Harness) -> None:
    """A replica frozen (SIGSTOP) past ORPHAN_TIMEOUT loses its rows to the survivor; its
    workers, still running, can only make late writes, which the fencing token turns into
    no-ops. After it thaws nothing is failed, lost or left running."""
    conf = competing_conf(h, ["a"])
    d1 = h.start(conf)
    d2 = h.start(conf)
    id1 = d1.dispatcher_id(h.conn)
    n = 40
    h.enqueue("a", [{"do": "sleep:0.5;next"} for _ in range(n)])
    wait_until(lambda: running_rows(h, id1) >= 2, 20, message="the first replica holds rows")
    held = h.conn.execute(
        "SELECT array_agg(workqueue_id) FROM pepsi.messages"
        " WHERE status = 'running' AND dispatcher_id = %s",
        (id1,),
    ).fetchone()[0]
    os.kill(d1.pid, signal.SIGSTOP)
    try:
        # the survivor takes them over after ORPHAN_TIMEOUT (3 s) and finishes them
        wait_until(
            lambda: h.conn.execute(
                "SELECT bool_and(status = 'done') FROM pepsi.messages WHERE workqueue_id = ANY(%s)",
                (held,),
            ).fetchone()[0],
            30,
            message=lambda: f"rows of the frozen replica finished by the survivor: {h.counts()}",
        )
    finally:
        os.kill(d1.pid, signal.SIGCONT)
    counts = h.wait_all(timeout=60)
    assert counts == {"done": n}, counts
    time.sleep(2)  # the thawed replica settles its stale answers
    assert h.counts() == {"done": n}, h.counts()
    assert running_rows(h) == 0
    assert d2.running(), d2.tail()
    # after the thaw: whether the stale replica re-registers or steps down, new work is
    # still processed exactly once (a stale replica claiming under a removed id would have
    # its rows reset under its workers by the survivor)
    registered = h.conn.execute("SELECT dispatcher_id FROM pepsi.dispatchers ORDER BY 1").fetchall()
    print(
        "thawed replica:",
        "running" if d1.running() else f"exited {d1.proc.returncode}",
        "registered:",
        registered,
    )
    more = h.enqueue("a", [{"do": "sleep:0.2;next"} for _ in range(40)])
    h.wait_all(timeout=60)
    assert h.counts() == {"done": n + 40}, h.counts()
    runs = Counter(r.wq_id for r in h.wlog().runs if r.wq_id >= more[0])
    twice = {i: c for i, c in runs.items() if c != 1}
    assert not twice, f"processed more than once after the thaw: {twice}"
    assert [p for p in h.overlaps() if p[0].wq_id >= more[0]] == []


def test_sigterm_while_database_is_down(own_cluster: tuple[Path, str], tmp_path: Path) -> None:
    """SIGTERM during a database outage: the dispatcher still ends in bounded time (it
    cannot release its rows), and the next start resets them as orphans: nothing lost."""
    base, dsn = own_cluster
    h = Harness(tmp_path, dsn)
    try:
        conf = h.conf(h.pipeline(["a"], PARALLELISM=2, QUEUE_LIMIT=2), SHUTDOWN_TIMEOUT="2 s")
        d = h.start(conf)
        n = 20
        h.enqueue("a", [{"do": "sleep:0.5;next"} for _ in range(n)])
        wait_until(lambda: running_rows(h) >= 2, 20, message="work in flight")
        h.conn.close()
        embedded.stop(base)
        t0 = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        rc = d.wait_exit(30)
        took = time.monotonic() - t0
        print(f"exit {rc} after {took:.1f} s with the database down")
        assert took < 20, f"shutdown with the database down took {took:.1f} s"
        assert rc in (0, 1), d.tail()
        embedded.start(base, "pepsi", fast=True)
        h.conn = psycopg.connect(dsn, autocommit=True)
        d2 = h.start(conf)
        counts = h.wait_all(timeout=60)
        assert counts == {"done": n}, counts
        assert d2.terminate() == 0
    finally:
        h.close()


def test_a_connection_lost_mid_wake_is_not_used_again_in_that_wake(h: Harness) -> None:
    """The work connection killed again and again while workers recycle (the
    gauges change) and statistics are due: a wake whose round trip lost the
    connection must not flush statistics or send gauges on it in the same
    wake. (It did: an AssertionError ended the dispatcher as an internal error.)"""
    stages = h.pipeline(["a"], PARALLELISM=2, QUEUE_LIMIT=1, MAX_MESSAGES=2)
    d = h.start(h.conf(stages, STATS_INTERVAL="0.05 s"))
    # (enough to keep the workers recycling through the 6 s of kills, a few
    # times what they finish meanwhile; every worker here is exec'd)
    n = 150
    ids = h.enqueue("a", [{"do": "sleep:0.005;next"} for _ in range(n)])
    # Its start-up over (a connection lost while it starts ends it: not this
    # test's case), once a first message is done.
    wait_until(lambda: h.row(ids[0])["status"] == "done", 60, message=d.tail)
    # At least 6 s of kills, and on until 10 of them (a loaded machine reconnects
    # more slowly), within 30 s.
    start = time.monotonic()
    killed = 0
    while d.running() and (
        time.monotonic() < start + 6 or (killed < 10 and time.monotonic() < start + 30)
    ):
        killed += h.conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = 'pepsi-dispatch work' AND datname = current_database()"
        ).fetchone()[0]
        time.sleep(0.02)
    assert d.running(), d.tail()
    assert killed >= 10
    assert "internal error" not in d.log(), d.tail()
    assert h.wait_all(timeout=120) == {"done": n}
    assert d.terminate() == 0
