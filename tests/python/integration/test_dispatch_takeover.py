"""Competing replicas: a replica that lost its rows, or is about to, runs no handler on them.

Two failures of one replica (A) while another (B) serves the same database:

* A frozen past ORPHAN_TIMEOUT (its dispatcher and its worker, as a suspended
  host): B resets A's rows and runs them. A's worker, thawed first, must not
  start the messages still queued on its pipe (the Python SDK pins a row as
  its dispatcher's before it calls the handler).
* A cut off from the database: it cannot renew its heartbeat, so it stops its
  workers a margin before ORPHAN_TIMEOUT, before B may reset and run its rows.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import struct
import termios
import time
from pathlib import Path

import psycopg
from db_proxy import SocketProxy
from dispatch_harness import (  # noqa: F401
    PYTHON,
    WORKERS,
    Dispatcher,
    Harness,
    harness_fixture,
    pid_alive,
    wait_until,
)

SDK_WORKER = WORKERS / "sdk_scripted_worker.py"


def sdk_conf(h: Harness, orphan_timeout: str, queue_limit: int = 4) -> Path:
    """Competing replicas of one SDK stage `a`, each with one long-lived worker."""
    program = f"{PYTHON} {SDK_WORKER} --log {h.worker_log}"
    stage = {"PROGRAM": program, "PARALLELISM": 1, "QUEUE_LIMIT": queue_limit}
    return h.conf(
        {"a": stage},
        COMPETING="YES",
        ORPHAN_TIMEOUT=orphan_timeout,
        WORKER_IDLE_TIMEOUT="120 s",
        SHUTDOWN_TIMEOUT="2 s",
    )


def _fionread(path: str) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    finally:
        os.close(fd)


def pipe_backlog(pid: int) -> tuple[int, int]:
    """Bytes waiting in a worker's input pipe, and in the pipe of its answers.

    The SDK reads ids from a read-only pipe descriptor and answers on a
    write-only one that is not its stderr (fd 1 and 2 both go to stderr)."""
    stderr = os.readlink(f"/proc/{pid}/fd/2")
    waiting_in = waiting_out = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        link = os.readlink(f"/proc/{pid}/fd/{fd}")
        if not link.startswith("pipe:"):
            continue
        info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        match = re.search(r"flags:\s+(\d+)", info)
        assert match is not None, info
        n = _fionread(f"/proc/{pid}/fd/{fd}")
        if int(match.group(1), 8) & os.O_ACCMODE == os.O_RDONLY:
            waiting_in += n
        elif link != stderr:
            waiting_out += n
    return waiting_in, waiting_out


def answered(worker: int) -> bool:
    """The worker read every id on its pipe and wrote answers (its dispatcher reads none)."""
    waiting_in, waiting_out = pipe_backlog(worker)
    return waiting_in == 0 and waiting_out > 0


def all_done(h: Harness, ids: list[int]) -> bool:
    return [h.row(i)["status"] for i in ids] == ["done"] * len(ids)


def test_a_thawed_worker_does_not_start_messages_another_replica_took_over(h: Harness) -> None:
    conf = sdk_conf(h, "2 s")
    a = h.start(conf)
    (warm,) = h.enqueue("a", 1)  # A's worker starts (and says it takes rows on its pipe)
    h.wait_all(timeout=60)
    worker = h.wlog().runs_of(warm)[0].pid
    os.kill(worker, signal.SIGSTOP)
    try:
        ids = h.enqueue("a", 2)
        # A claims them and writes them to its frozen worker's pipe; then A freezes too
        wait_until(lambda: pipe_backlog(worker)[0] > 0, 30, message="ids on the frozen pipe")
        assert all(h.row(i)["status"] == "running" for i in ids)
        os.kill(a.pid, signal.SIGSTOP)
        b = h.start(conf)
        # B finds A's heartbeat older than ORPHAN_TIMEOUT, resets the rows and runs them
        wait_until(lambda: all_done(h, ids), 60, message=lambda: f"B runs them: {h.counts()}")
        os.kill(worker, signal.SIGCONT)  # the worker first: its dispatcher is still frozen
        wait_until(lambda: answered(worker), 30, message="the thawed worker answers its ids")
        started = [r.wq_id for r in h.wlog().runs if r.pid == worker]
        assert started == [warm], f"the thawed worker started {started[1:]} again"
    finally:
        os.kill(worker, signal.SIGCONT)
        os.kill(a.pid, signal.SIGCONT)
    wait_until(lambda: "declared dead" in a.log(), 30, message=lambda: "A learns: " + a.tail())
    wait_until(lambda: not pid_alive(worker), 30, message="A kills its old worker")
    assert [len(h.wlog().runs_of(i)) for i in ids] == [1, 1]  # B's runs, once each
    assert all_done(h, ids), h.counts()
    more = h.enqueue("a", 4)  # both replicas serve on
    h.wait_all(timeout=60)
    assert all_done(h, more)
    assert a.terminate() == 0 and b.terminate() == 0


def _via(dsn: str, host: Path) -> str:
    """``dsn`` with its socket directory replaced by ``host``."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params["host"] = str(host)
    return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]


def test_a_replica_cut_off_from_the_database_stops_its_workers_before_orphan_timeout(
    h: Harness, tmp_path: Path
) -> None:
    server_dir = Path(str(psycopg.conninfo.conninfo_to_dict(h.dsn)["host"]))
    proxy_dir = tmp_path / "proxy"
    proxy_dir.mkdir()
    proxy = SocketProxy(server_dir, proxy_dir)
    orphan_timeout = 6.0
    conf = sdk_conf(h, f"{orphan_timeout:g} s", queue_limit=1)
    a = h.start(conf, dsn=_via(h.dsn, proxy_dir))
    (mid,) = h.enqueue("a", [{"plan": {"a": {"op": "finish", "sleep": 12}}}])
    runs = wait_until(lambda: h.wlog().runs_of(mid), 30, message="A starts the message")
    worker = runs[0].pid
    b = h.start(conf)
    try:
        cut = time.monotonic()
        proxy.cut()  # A (and its worker) can no longer reach the database
        wait_until(
            lambda: not pid_alive(worker),
            orphan_timeout,
            0.02,
            lambda: f"A's worker stopped within ORPHAN_TIMEOUT of the cut:\n{a.tail()}",
        )
        stopped = time.monotonic_ns()
        wait_until(lambda: "could not renew this replica's heartbeat" in a.log(), 10)
        assert time.monotonic() - cut < orphan_timeout
        # B resets the row once A's heartbeat is older than ORPHAN_TIMEOUT, and runs it
        again = wait_until(
            lambda: h.wlog().runs_of(mid)[1:], 60, message=lambda: "B runs it:\n" + b.tail()
        )
        assert again[0].start > stopped, "B started it while A's worker could still run"
    finally:
        proxy.restore()
    wait_until(lambda: "declared dead" in a.log(), 60, message=lambda: "A comes back: " + a.tail())
    h.wait_all(timeout=60)
    assert h.row(mid)["status"] == "done"
    assert a.terminate() == 0 and b.terminate() == 0


#: When the server last (re)started, as pepsi.replicas_away reckons it.
SERVER_RESTART_SQL = (
    "SELECT greatest(pg_postmaster_start_time(), (SELECT stats_reset FROM pg_stat_bgwriter),"
    " pg_last_xact_replay_timestamp())"
)


def register_away(h: Harness) -> int:
    """A replica that last heartbeated just before the server started, with no
    session (no liveness lock): one whose claims the restart may have lost."""
    restart = h.conn.execute(SERVER_RESTART_SQL).fetchone()[0]  # type: ignore[index]
    return h.conn.execute(
        "INSERT INTO pepsi.dispatchers (hostname, pid, competing, heartbeat_at)"
        " VALUES ('away', 2, true, %s - interval '1 s') RETURNING dispatcher_id",
        (restart,),
    ).fetchone()[0]  # type: ignore[index]


def held_until_back(h: Harness, a: Dispatcher, away: int) -> None:
    """New messages stay pending while replica ``away`` is away (the wait is
    logged); once its session holds its liveness lock again (its next
    heartbeat takes it), they are claimed and run."""
    ids = h.enqueue("a", 2)
    wait_until(
        lambda: f"replica(s) {away} (host away, pid 2) ran: claiming nothing" in a.log(),
        30,
        message=lambda: "the wait is logged: " + a.tail(),
    )
    assert [h.row(i)["status"] for i in ids] == ["pending", "pending"]
    h.conn.execute("SELECT pg_advisory_lock(1885629558, (%s::bigint & 2147483647)::int)", (away,))
    wait_until(lambda: all_done(h, ids), 60, message=lambda: f"claimed once back: {h.counts()}")
    assert "the other replicas are back" in a.log()


def test_after_a_server_restart_a_replica_claims_nothing_until_the_others_are_back(
    h: Harness,
) -> None:
    """Claims commit without waiting for their WAL flush, so a crash can lose a
    replica's last claims while its workers still run their rows. A replica
    that last heartbeated before the server started and has no session may be
    such a one: a replica that connects claims nothing until it is back (its
    session holds its liveness lock again) or ORPHAN_TIMEOUT old."""
    away = register_away(h)
    a = h.start(sdk_conf(h, "2592000 s"))  # 30 days: the server's start is younger
    held_until_back(h, a, away)
    assert a.terminate() == 0


def test_a_work_connection_reopened_alone_holds_claims_too(h: Harness) -> None:
    """A work connection reopened alone (the listen one not yet seen dead) may
    have reached a restarted or promoted server: the replica asks which
    replicas are away before it claims again, as after a full reconnect."""
    # POLL_INTERVAL 1 s: the heartbeat finds the terminated work session soon
    conf = h.conf(
        {"a": {"PROGRAM": f"{PYTHON} {SDK_WORKER} --log {h.worker_log}", "PARALLELISM": 1}},
        COMPETING="YES",
        ORPHAN_TIMEOUT="2592000 s",
        POLL_INTERVAL="1 s",
    )
    a = h.start(conf)
    first = h.enqueue("a", 1)
    h.wait_all(timeout=60)
    assert all_done(h, first)
    away = register_away(h)
    h.conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = 'pepsi-dispatch work'"
    )
    wait_until(
        lambda: "work connection only" in a.log(), 30, message=lambda: "reconnects: " + a.tail()
    )
    held_until_back(h, a, away)
    assert a.terminate() == 0
