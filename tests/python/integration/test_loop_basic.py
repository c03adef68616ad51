"""Smoke tests of the dispatcher loop (coordinator.dispatcher, stage pools, processes, stats).

Unit tests of the answer parser and the stats deltas, then a real
``pepsi-dispatch serve`` process against the fixture database with the small
worker in ``support/workers/basic_worker.py``. The adversarial suite lives in
``test_dispatch_*.py``; these are the dispatcher author's own checks of the
paths that suite does not single out.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pepsi_dispatch.coordinator.database.link import LinkState
from pepsi_dispatch.coordinator.stats import Stats
from pepsi_dispatch.coordinator.workers.answers import AnswerKind, parse_answer

ROOT = Path(__file__).resolve().parents[3]
DISPATCH = ROOT / ".venv" / "bin" / "pepsi-dispatch"
WORKER = Path(__file__).resolve().parents[1] / "support" / "workers" / "basic_worker.py"


# ---------------------------------------------------------------- unit tests


@pytest.mark.parametrize(
    ("line", "kind", "fused"),
    [
        (b"0", AnswerKind.OK, ()),
        (b"0\r", AnswerKind.OK, ()),
        (b"0 fused=b,c", AnswerKind.OK, ("b", "c")),
        (b"0 fused=b", AnswerKind.OK, ("b",)),
        (b"3 disk full", AnswerKind.FAILED, ()),
        (b"-1", AnswerKind.FAILED, ()),
        (b"", AnswerKind.PROTOCOL_ERROR, ()),
        (b"ok", AnswerKind.PROTOCOL_ERROR, ()),
        (b"0 done", AnswerKind.PROTOCOL_ERROR, ()),
        (b"0 fused=", AnswerKind.PROTOCOL_ERROR, ()),
        (b"0 fused=b c", AnswerKind.PROTOCOL_ERROR, ()),
        (b"0 fused=b,,c", AnswerKind.PROTOCOL_ERROR, ()),
        (b"\xff\xfe", AnswerKind.PROTOCOL_ERROR, ()),
    ],
)
def test_parse_answer(line: bytes, kind: str, fused: tuple[str, ...]) -> None:
    answer = parse_answer(line)
    assert answer.kind == kind
    assert answer.fused == fused


def test_failed_answer_keeps_the_line_as_reason() -> None:
    assert parse_answer(b"7 upstream said no").text == "7 upstream said no"


def test_nul_in_an_answer_cannot_poison_the_database_write() -> None:
    assert "\x00" not in parse_answer(b"3 bad\x00byte").text
    assert "\x00" not in parse_answer(b"garbage\x00").text


def test_stats_deltas_and_clear() -> None:
    s = Stats()
    assert not s.pending()
    s.handed_out(3)
    s.succeeded("a", 0.5, ("b", "c"))
    s.failed("a", 0.25)
    s.crashed("b", 1.0)
    s.timed_out("c", 2.0)
    args = s.flush_args()
    by = dict(zip(args["stages"], range(len(args["stages"])), strict=True))
    assert args["processed"][by["a"]] == 1 and args["processed"][by["b"]] == 1
    assert args["failed"][by["a"]] == 1
    assert args["crashes"][by["b"]] == 1 and args["timeouts"][by["c"]] == 1
    assert args["seconds"][by["a"]] == pytest.approx(0.75)
    assert args["stage_runs"] == 4 and args["messages"] == 3
    s.clear()
    assert not s.pending()
    assert s.total_messages == 3 and s.total_stage_runs == 4


def test_overlong_answer_across_reads_is_one_answer() -> None:
    """A 100 KiB answer line arriving over several reads is ONE answer (its head).

    Regression: the head went out once the partial line passed 64 KiB and the rest
    of the line, at its newline, became a second answer (for the next id).
    """
    from pepsi_dispatch.coordinator.workers.process import WorkerProcess

    r, wfd = os.pipe()
    os.set_blocking(r, False)
    w = WorkerProcess.__new__(WorkerProcess)
    w.stdout_fd = r
    w._out_partial = b""
    w._out_skipping = False
    try:
        got: list[bytes] = []
        os.write(wfd, b"3 " + b"x" * 40000)
        got += w.read_answers() or []
        os.write(wfd, b"x" * 40000)
        got += w.read_answers() or []
        os.write(wfd, b"x" * 30000)
        got += w.read_answers() or []
        os.write(wfd, b"x" * 20 + b"\n0\n")
        got += w.read_answers() or []
        assert len(got) == 2
        assert got[0].startswith(b"3 xxx") and len(got[0]) == 8192
        assert parse_answer(got[0]).kind is AnswerKind.FAILED
        assert got[1] == b"0"
        os.close(wfd)
        wfd = -1
        assert w.read_answers() is None
    finally:
        os.close(r)
        if wfd >= 0:
            os.close(wfd)


def test_reload_pending_does_not_spin_a_shutdown(tmp_path: Path) -> None:
    """A reload never runs while stopping, so it must not make the loop poll at 0 s."""
    from pepsi_dispatch.config import load_config
    from pepsi_dispatch.coordinator.dispatcher import Dispatcher

    conf = write_conf(tmp_path / "pepsi.conf", {"a": {"PROGRAM": "/bin/true"}})
    d = Dispatcher(load_config(str(conf)))
    now = time.monotonic()
    d.link.up(0)
    d.ledger.claimed_pass()
    for duty in d.heartbeat_duties:
        duty.next_at = now + 30
    d.flip.at = now + 30
    d.reload_pending = True
    assert d.next_timeout(now) == 0.0
    d.shutting_down = True
    d.shutdown_deadline = now + 5
    assert d.next_timeout(now) > 1.0


def test_connections_get_connect_and_tcp_timeouts_unless_the_dsn_sets_them(dsn: str) -> None:
    from psycopg.conninfo import make_conninfo

    from pepsi_dispatch.coordinator.database.postgres import PostgresStore

    db = PostgresStore(dsn, False)
    db.connect()
    try:
        for c in (db.listen, db.work):
            assert c is not None
            params = c.info.get_parameters()
            assert params["connect_timeout"] == "10"
            assert params["tcp_user_timeout"] == "60000"
    finally:
        db.close()
    db = PostgresStore(make_conninfo(dsn, connect_timeout="3"), False)
    db.connect()
    try:
        assert db.work is not None
        assert db.work.info.get_parameters()["connect_timeout"] == "3"
    finally:
        db.close()


def in_process_dispatcher(dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A started Dispatcher (connected, locked, registered) without its loop, nor
    the template probe its loop's first wake would start."""
    from pepsi_dispatch.config import load_config
    from pepsi_dispatch.coordinator.dispatcher import Dispatcher

    monkeypatch.setenv("PEPSI_DSN", dsn)
    conf = write_conf(tmp_path / "pepsi.conf", {"a": {"PROGRAM": "/bin/true"}})
    d = Dispatcher(load_config(str(conf)))
    d.start()
    d.supervisor.probes_pending = False
    return d


def test_reconnect_after_a_bad_reload_does_not_abort(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad reloaded config begins a graceful shutdown (fatal set); a reconnect then
    must come back normally -- only a lost lock aborts (held rows, owed writes kept)."""
    d = in_process_dispatcher(dsn, tmp_path, monkeypatch)
    try:
        d.fatal = "reloaded configuration does not parse: test"
        d.db.close()
        d.link.lost(time.monotonic(), psycopg.OperationalError("link down"))
        d._reconnect(time.monotonic())
        assert d.link.connected
    finally:
        d.db.close()


def test_query_error_keeps_the_lock_and_a_broken_work_connection_alone_is_reopened(
    dsn: str, conn: psycopg.Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: every psycopg.Error closed both connections, so a plain query
    error (lock_timeout, statement_timeout, ...) gave up the advisory lock."""
    from pepsi_dispatch.coordinator.database.postgres import LOCK_KEY

    def lock_free() -> bool:
        (got,) = conn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()
        if got:
            conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))
        return bool(got)

    d = in_process_dispatcher(dsn, tmp_path, monkeypatch)
    try:
        listen = d.db.listen
        listen_pid = listen.info.backend_pid
        assert d.db.work is not None
        # 1. A query error (in a pipeline, as on the hot path): nothing is closed.
        with pytest.raises(psycopg.Error) as err:
            with d.db.work.pipeline():
                d.db.work.execute("SELECT 1/0")
        now = time.monotonic()
        d.link.lost(now, err.value)
        assert d.link.state is LinkState.HOLDING
        assert d.link.connected and d.db.listen is listen and d.link.hold_until > now
        assert not lock_free()
        assert d.next_timeout(now) > 0  # no database work until the pause is over
        d.db.work.execute("SELECT 1")  # the work connection is still usable
        # 2. The work connection breaks: only it is reopened; the lock stays.
        d.link.hold_until = 0.0
        conn.execute("SELECT pg_terminate_backend(%s)", (d.db.work.info.backend_pid,))
        time.sleep(0.2)
        with pytest.raises(psycopg.Error) as err:
            d.db.work.execute("SELECT 1")
        d.link.lost(time.monotonic(), err.value)
        assert d.link.state is LinkState.RECONNECT_WORK
        assert not d.link.connected and d.db.listen is listen
        assert not lock_free()
        d._reconnect(time.monotonic())
        assert d.link.connected and d.db.listen is listen
        assert d.db.listen.info.backend_pid == listen_pid
        d.db.work.execute("SELECT 1")
        assert not lock_free()
    finally:
        d.db.close()


def reconnect_until_connected(d: Any, timeout: float = 10) -> None:
    """Run the in-process dispatcher's reconnect attempts on their schedule until
    its link is up (fails after ``timeout`` s: the lock was not retaken)."""
    deadline = time.monotonic() + timeout
    while not d.link.connected:
        assert time.monotonic() < deadline, "lock not retaken"
        time.sleep(max(0.0, d.link.reconnect_at - time.monotonic()))
        d._reconnect(time.monotonic())


def test_reconnect_takes_the_lock_back_from_our_own_old_session(
    dsn: str, conn: psycopg.Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a partition longer than the keepalives the server may still run the old
    listen backend, holding the lock: the reconnect terminates it and goes on.

    Regression: try_lock failed and the dispatcher aborted, believing another
    dispatcher had taken over.
    """
    d = in_process_dispatcher(dsn, tmp_path, monkeypatch)
    old = d.db.listen
    try:
        old_pid = d.db.listen_pid()
        d.stats.handed_out(2)
        # The client gives the link up; the server side lives on (lock held).
        d.db.listen = None
        d.link.lost(time.monotonic(), psycopg.OperationalError("link down"))
        assert d.link.state is LinkState.RECONNECT_ALL
        reconnect_until_connected(d)
        assert d.link.lock_lost is None
        new_pid = d.db.listen_pid()
        assert new_pid != old_pid
        (alive_old,) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (old_pid,)
        ).fetchone()
        assert alive_old == 0
        assert d.db.lock_pids() == {new_pid}
    finally:
        d.db.close()
        old.close()


def test_a_reconnect_failing_after_the_lock_was_taken_still_knows_that_session(
    dsn: str, conn: psycopg.Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reconnect takes the lock, then fails (the connection is terminated again
    before LISTEN and the registration went through). Its session may still hold the
    lock when the next attempt runs: that session is ours, so it is terminated and
    the lock retaken.

    Regression: only a fully successful reconnect recorded its listen session, so the
    next attempt took our own half-done session for another dispatcher and stopped.
    """
    d = in_process_dispatcher(dsn, tmp_path, monkeypatch)
    leftover: list[psycopg.Connection] = []
    try:
        d.db.close()
        d.link.lost(time.monotonic(), psycopg.OperationalError("link down"))
        real_listening, real_close = d.db.start_listening, d.db.close

        def fails_once() -> None:
            d.db.start_listening = real_listening
            raise psycopg.OperationalError("terminated again mid-reconnect")

        def close_but_the_server_lives_on() -> None:
            # The server has not yet noticed the client gone: the lock stays held.
            if d.db.listen is not None:  # not connect()'s own close of nothing
                leftover.append(d.db.listen)
                d.db.listen = None
                d.db.close = real_close
            real_close()

        monkeypatch.setattr(d.db, "start_listening", fails_once)
        monkeypatch.setattr(d.db, "close", close_but_the_server_lives_on)
        d._reconnect(time.monotonic())
        assert not d.link.connected and leftover, "the first attempt should have failed"
        half_done_pid = leftover[0].info.backend_pid
        assert d.db.listen is None
        reconnect_until_connected(d)
        assert d.link.lock_lost is None
        assert d.db.lock_pids() == {d.db.listen_pid()} != {half_done_pid}
    finally:
        d.db.close()
        for c in leftover:
            c.close()


def test_lock_pids_sees_only_this_database(
    dsn: str, conn: psycopg.Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Advisory locks are per database: a dispatcher of another database on the same
    server holds the same key. On a reconnect its session must not read as "another
    session holds our lock" (the dispatcher would give up serving)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from pepsi_dispatch.coordinator.database.postgres import LOCK_KEY

    other_db = f"pepsi_lock_other_{os.getpid()}"
    conn.execute(f'DROP DATABASE IF EXISTS "{other_db}"')
    conn.execute(f'CREATE DATABASE "{other_db}"')
    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items()}
    params["dbname"] = other_db
    d = in_process_dispatcher(dsn, tmp_path, monkeypatch)
    try:
        with psycopg.connect(make_conninfo(**params), autocommit=True) as other:
            other.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
            other_pid = other.info.backend_pid
            assert d.db.lock_pids() == {d.db.listen_pid()}, f"{other_pid} is another database's"
    finally:
        d.db.close()
        conn.execute(f'DROP DATABASE IF EXISTS "{other_db}"')


def test_lock_really_lost_on_reconnect_still_flushes_stats(
    dsn: str, conn: psycopg.Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pepsi_dispatch.coordinator.database.postgres import LOCK_KEY
    from pepsi_dispatch.errors import FatalError

    d = in_process_dispatcher(dsn, tmp_path, monkeypatch)
    try:
        d.stats.handed_out(7)
        conn.execute("SELECT pg_terminate_backend(%s)", (d.db.listen_pid(),))
        time.sleep(0.2)
        with pytest.raises(psycopg.Error) as err:
            d.db.ping_listen()
        d.link.lost(time.monotonic(), err.value)
        assert d.db.listen is None
        # Another dispatcher takes the lock meanwhile.
        conn.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
        with pytest.raises(FatalError, match="lost the database to another dispatcher"):
            d._reconnect(time.monotonic())
        assert conn.execute("SELECT messages FROM pepsi.dispatch_stats").fetchone() == (7,)
    finally:
        d.db.close()


# ---------------------------------------------------------------- dispatcher process


class Served:
    """One ``pepsi-dispatch serve`` process with its log file."""

    def __init__(self, dsn: str, conf: Path, log: Path) -> None:
        self.log = log
        env = {**os.environ, "PEPSI_DSN": dsn}
        env.pop("PEPSI_CONFIG", None)
        self.proc = subprocess.Popen(
            [str(DISPATCH), "-c", str(conf), "-L", "DEBUG", "serve"],
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            env=env,
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def wait_for(
    pred: Callable[[], Any], timeout: float = 30, what: str | Callable[[], str] = "condition"
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            text = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout} s waiting for {text}")
        time.sleep(0.05)


def write_conf(
    path: Path, stages: dict[str, dict[str, str]], dispatch: dict[str, str] | None = None
) -> Path:
    opts = {
        "SERVICE_USER": "root",
        "POLL_INTERVAL": "60 s",
        "STATS_INTERVAL": "60 s",
        "WORKER_IDLE_TIMEOUT": "2 s",
        "SHUTDOWN_TIMEOUT": "5 s",
        "RETENTION": "0",
        **(dispatch or {}),
    }
    lines = ["[pepsi-dispatch]", *(f"{k} = {v}" for k, v in opts.items()), ""]
    for name, options in stages.items():
        lines.append(f"[stage-{name}]")
        lines += [f"{k} = {v}" for k, v in options.items()]
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def program(*args: str) -> str:
    return " ".join([sys.executable, str(WORKER), *args])


def counts(conn: psycopg.Connection) -> dict[str, int]:
    rows = conn.execute("SELECT status, count(*) FROM pepsi.messages GROUP BY status").fetchall()
    return {s: n for s, n in rows}


def enqueue(conn: psycopg.Connection, stage: str, n: int) -> list[int]:
    rows = conn.execute(
        "SELECT pepsi.enqueue_many(%s, array_fill('{}'::jsonb, array[%s]))", (stage, n)
    ).fetchall()
    return [r[0] for r in rows]


def children(pid: int) -> list[int]:
    """Live worker children of ``pid`` (not its group sentinel,
    pepsi_dispatch/coordinator/workers/sentinel.py)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if " (pepsi-sentinel) " in stat:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry))
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def served(dsn: str, tmp_path: Path) -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def start(conf: Path) -> Served:
        s = Served(dsn, conf, tmp_path / f"dispatch{len(started)}.log")
        started.append(s)
        return s

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


def test_two_stage_pipeline_stats_and_clean_stop(
    conn: psycopg.Connection, tmp_path: Path, served: Callable[..., Served]
) -> None:
    envfile = tmp_path / "env.jsonl"
    prog = program("--next", "a=b", "--env-file", str(envfile))
    conf = write_conf(
        tmp_path / "pepsi.conf",
        {
            "a": {"PROGRAM": prog, "NEXT": "b", "PARALLELISM": "2", "QUEUE_LIMIT": "8"},
            "b": {"PROGRAM": prog, "PARALLELISM": "2", "QUEUE_LIMIT": "8"},
        },
        {"CONFIG_FILE": str(tmp_path / "pepsi.conf")},
    )
    d = served(conf)
    enqueue(conn, "a", 200)
    wait_for(lambda: counts(conn) == {"done": 200}, what="200 rows done")
    # Stats are flushed when the pipeline goes idle (at most once a second).
    wait_for(
        lambda: (
            conn.execute("SELECT coalesce(sum(processed), 0) FROM pepsi.stage_stats").fetchone()[0]
            == 400
        ),
        what="stage_stats processed = 400",
    )
    runs, messages = conn.execute(
        "SELECT stage_runs, messages FROM pepsi.dispatch_stats"
    ).fetchone()
    assert (runs, messages) == (400, 400)
    # Workers got the contract's argv and environment.
    starts = [json.loads(line) for line in envfile.read_text().splitlines()]
    assert starts
    for s in starts:
        assert s["argv"][-3:] == ["-c", str(conf), "worker"]
        assert s["env"]["PEPSI_STAGE"] in ("a", "b")
        assert s["env"]["PEPSI_DISPATCHER_ID"].isdigit()
        assert s["env"]["PEPSI_DSN"]
    assert d.stop() == 0
    text = d.text()
    assert "pepsi-dispatch started" in text and "pepsi-dispatch stopped" in text
    assert conn.execute("SELECT count(*) FROM pepsi.dispatchers").fetchone()[0] == 0


def test_late_answer_never_fails_the_rows_next_run(
    conn: psycopg.Connection, tmp_path: Path, served: Callable[..., Served]
) -> None:
    """Stage a advances, then answers late; b has the row by then. Nothing may fail.

    Regression: check_answered for a's ``0`` used to fail the row that was
    meanwhile running at b ("answered 0 but left the row running").
    """
    prog = program("--next", "a=b", "--sleep-before-answer", "a=0.3", "--sleep", "b=0.5")
    conf = write_conf(
        tmp_path / "pepsi.conf",
        {
            "a": {"PROGRAM": prog, "NEXT": "b", "PARALLELISM": "2", "QUEUE_LIMIT": "2"},
            "b": {"PROGRAM": prog, "PARALLELISM": "4", "QUEUE_LIMIT": "1"},
        },
    )
    d = served(conf)
    enqueue(conn, "a", 12)
    wait_for(lambda: counts(conn) == {"done": 12}, timeout=60, what="12 rows done")
    assert "left it running" not in d.text()
    assert d.stop() == 0


def test_id_held_twice_by_one_worker_keeps_its_protection(
    conn: psycopg.Connection, tmp_path: Path, served: Callable[..., Served]
) -> None:
    """The stage advances a row to itself and answers late; the claim (every 100 ms,
    POLL_INTERVAL) gives the row to the same worker again meanwhile. Nothing may fail.

    Regression: the first answer removed the id from the owed-write filter although
    the worker still held it, so check_answered failed the row's second run.
    """
    prog = program("--again", "a", "--sleep-before-answer", "a=0.5")
    conf = write_conf(
        tmp_path / "pepsi.conf",
        {"a": {"PROGRAM": prog, "PARALLELISM": "1", "QUEUE_LIMIT": "4"}},
        {"POLL_INTERVAL": "100 ms"},
    )
    d = served(conf)
    enqueue(conn, "a", 3)
    wait_for(lambda: counts(conn) == {"done": 3}, timeout=30, what="3 rows done")
    assert "left it running" not in d.text()
    assert d.stop() == 0


def test_fused_answers_count_for_the_fused_stages(
    conn: psycopg.Connection, tmp_path: Path, served: Callable[..., Served]
) -> None:
    prog = program("--fuse", "a=b,c")
    conf = write_conf(
        tmp_path / "pepsi.conf",
        {
            "a": {"PROGRAM": prog, "NEXT": "b"},
            "b": {"PROGRAM": prog, "NEXT": "c"},
            "c": {"PROGRAM": prog},
        },
    )
    d = served(conf)
    enqueue(conn, "a", 10)
    wait_for(lambda: counts(conn) == {"done": 10}, what="10 rows done")
    assert d.stop() == 0
    got = dict(conn.execute("SELECT stage, processed FROM pepsi.stage_stats").fetchall())
    assert got == {"a": 10, "b": 10, "c": 10}
    assert conn.execute("SELECT stage_runs, messages FROM pepsi.dispatch_stats").fetchone() == (
        30,
        10,
    )


def test_workers_die_with_a_killed_dispatcher(
    conn: psycopg.Connection, tmp_path: Path, served: Callable[..., Served]
) -> None:
    prog = program("--sleep", "a=30")
    conf = write_conf(
        tmp_path / "pepsi.conf", {"a": {"PROGRAM": prog, "PARALLELISM": "3", "QUEUE_LIMIT": "1"}}
    )
    d = served(conf)
    enqueue(conn, "a", 3)
    kids = wait_for(lambda: len(children(d.proc.pid)) == 3 and children(d.proc.pid), what="3")
    d.proc.kill()
    d.proc.wait()
    wait_for(lambda: not any(alive(p) for p in kids), timeout=5, what="workers gone")


def test_lost_connections_are_reestablished(
    conn: psycopg.Connection, tmp_path: Path, served: Callable[..., Served]
) -> None:
    """pg_terminate_backend on both dispatcher connections mid-run loses nothing."""
    prog = program("--next", "a=b", "--sleep", "a=0.01")
    conf = write_conf(
        tmp_path / "pepsi.conf",
        {
            "a": {"PROGRAM": prog, "NEXT": "b", "PARALLELISM": "2"},
            "b": {"PROGRAM": prog, "PARALLELISM": "2"},
        },
    )
    d = served(conf)
    enqueue(conn, "a", 300)
    wait_for(lambda: counts(conn).get("done", 0) > 20, what="some rows done")
    for _ in range(3):
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name LIKE 'pepsi-dispatch%%' AND pid <> pg_backend_pid()"
        )
        time.sleep(0.5)
    wait_for(
        lambda: counts(conn) == {"done": 300},
        timeout=60,
        what=lambda: f"300 rows done, have {counts(conn)}; log tail:\n{d.text()[-3000:]}",
    )
    text = d.text()
    assert "re-established" in text
    assert d.stop() == 0
    assert counts(conn) == {"done": 300}


def test_sigterm_releases_rows_in_flight(
    conn: psycopg.Connection, tmp_path: Path, served: Callable[..., Served]
) -> None:
    prog = program("--sleep", "a=0.5")
    conf = write_conf(
        tmp_path / "pepsi.conf", {"a": {"PROGRAM": prog, "PARALLELISM": "2", "QUEUE_LIMIT": "4"}}
    )
    d = served(conf)
    enqueue(conn, "a", 40)
    wait_for(lambda: counts(conn).get("running", 0) == 8, what="8 rows running")
    assert d.stop() == 0
    c = counts(conn)
    assert "running" not in c and c.get("failed", 0) == 0
    assert c.get("pending", 0) + c.get("done", 0) == 40


def test_max_messages_recycles_workers(
    conn: psycopg.Connection, tmp_path: Path, served: Callable[..., Served]
) -> None:
    envfile = tmp_path / "env.jsonl"
    prog = program("--env-file", str(envfile))
    conf = write_conf(
        tmp_path / "pepsi.conf",
        {"a": {"PROGRAM": prog, "PARALLELISM": "1", "QUEUE_LIMIT": "4", "MAX_MESSAGES": "10"}},
    )
    d = served(conf)
    enqueue(conn, "a", 35)
    wait_for(lambda: counts(conn) == {"done": 35}, what="35 rows done")
    # 35 messages, at most 10 per worker: at least 4 workers, one at a time.
    assert len(envfile.read_text().splitlines()) >= 4
    assert "MAX_MESSAGES (10) reached" in d.text()
    assert d.stop() == 0


def test_sighup_reloads_and_retires_workers(
    conn: psycopg.Connection, tmp_path: Path, served: Callable[..., Served]
) -> None:
    prog = program()
    conf = write_conf(
        tmp_path / "pepsi.conf",
        {"a": {"PROGRAM": prog, "PARALLELISM": "1"}},
        {"WORKER_IDLE_TIMEOUT": "60 s"},
    )
    d = served(conf)
    enqueue(conn, "a", 3)
    wait_for(lambda: counts(conn) == {"done": 3}, what="3 rows done")
    (first,) = wait_for(lambda: children(d.proc.pid), what="one worker")
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "configuration reloaded" in d.text(), what="reload line")
    wait_for(lambda: not alive(first), timeout=10, what="old worker retired")
    enqueue(conn, "a", 3)
    wait_for(lambda: counts(conn) == {"done": 6}, what="6 rows done")
    assert d.stop() == 0


def test_retention_purges_old_done_rows_on_the_heartbeat(
    conn: psycopg.Connection, tmp_path: Path, served: Callable[..., Served]
) -> None:
    conf = write_conf(
        tmp_path / "pepsi.conf",
        {"a": {"PROGRAM": program()}},
        {"RETENTION": "1 s", "POLL_INTERVAL": "500 ms"},
    )
    d = served(conf)
    enqueue(conn, "a", 5)
    wait_for(lambda: counts(conn) == {"done": 5}, what="5 rows done")
    wait_for(lambda: counts(conn) == {}, timeout=10, what="done rows purged")
    assert "purged 5 done row(s)" in d.text() or "purged" in d.text()
    assert d.stop() == 0


def test_stdout_flood_is_one_protocol_error(
    conn: psycopg.Connection, tmp_path: Path, served: Callable[..., Served]
) -> None:
    """A worker spewing stdout forever fails its message and is killed; the loop stays live."""
    conf = write_conf(
        tmp_path / "pepsi.conf",
        {
            "flood": {"PROGRAM": "sh -c 'read x; yes garbage'", "PARALLELISM": "1"},
            "ok": {"PROGRAM": program()},
        },
    )
    d = served(conf)
    (bad,) = enqueue(conn, "flood", 1)
    enqueue(conn, "ok", 5)
    wait_for(
        lambda: (
            conn.execute(
                "SELECT status, state->>'dispatch_error' FROM pepsi.messages"
                " WHERE workqueue_id = %s",
                (bad,),
            ).fetchone()
            == ("failed", 'protocol error: worker answered "garbage"')
        ),
        what="flood message failed",
    )
    wait_for(
        lambda: (
            conn.execute(
                "SELECT count(*) FROM pepsi.messages WHERE stage = 'ok' AND status = 'done'"
            ).fetchone()[0]
            == 5
        ),
        what="other stage unaffected",
    )
    assert d.stop() == 0


def test_lock_taken_over_during_reconnect_ends_with_exit_1(
    dsn: str, conn: psycopg.Connection, tmp_path: Path, served: Callable[..., Served]
) -> None:
    """Another holder of the advisory lock after a reconnect: workers stopped, exit 1."""
    from pepsi_dispatch.coordinator.database.postgres import LOCK_KEY

    prog = program("--sleep", "a=30")
    conf = write_conf(tmp_path / "pepsi.conf", {"a": {"PROGRAM": prog, "PARALLELISM": "1"}})
    d = served(conf)
    enqueue(conn, "a", 1)
    (kid,) = wait_for(lambda: children(d.proc.pid), what="a worker")
    with psycopg.connect(dsn, autocommit=True) as thief:
        thief.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name LIKE 'pepsi-dispatch%%'"
        )
        # Blocks until the dispatcher's old session is gone, then holds the lock.
        thief.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
        assert d.proc.wait(20) == 1
    assert "lost the database to another dispatcher" in d.text()
    wait_for(lambda: not alive(kid), timeout=5, what="worker gone")


def test_worker_start_up_is_not_charged_to_max_runtime(
    conn: psycopg.Connection, tmp_path: Path, served: Callable[..., Served]
) -> None:
    """1.5 s of start-up, 0.3 s per message, MAX_RUNTIME 1 s: nothing times out."""
    prog = program("--startup-delay", "1.5", "--sleep", "a=0.3")
    conf = write_conf(
        tmp_path / "pepsi.conf",
        {"a": {"PROGRAM": prog, "PARALLELISM": "1", "QUEUE_LIMIT": "2"}},
        {"MAX_RUNTIME": "1 s"},
    )
    d = served(conf)
    enqueue(conn, "a", 3)
    wait_for(lambda: counts(conn) == {"done": 3}, what="3 rows done")
    assert d.stop() == 0


def test_program_exiting_before_reading_fails_nothing(
    conn: psycopg.Connection, tmp_path: Path, served: Callable[..., Served]
) -> None:
    """/bin/false exits before reading its input: rows stay pending, cooldown grows."""
    conf = write_conf(tmp_path / "pepsi.conf", {"a": {"PROGRAM": "/bin/false"}})
    d = served(conf)
    enqueue(conn, "a", 5)
    wait_for(lambda: "holding off new workers for 2 s" in d.text(), what="second cooldown")
    time.sleep(0.5)
    assert counts(conn) == {"pending": 5}
    assert "before reading its input (" in d.text()
    assert "message(s) stay pending); holding off new workers for 1 s" in d.text()
    assert "crashed" not in d.text()
    assert d.proc.poll() is None
    assert d.stop() == 0
    assert counts(conn) == {"pending": 5}


def test_crash_after_reading_still_fails_the_head(
    conn: psycopg.Connection, tmp_path: Path, served: Callable[..., Served]
) -> None:
    prog = "sh -c 'read x; exit 3'"
    conf = write_conf(
        tmp_path / "pepsi.conf", {"a": {"PROGRAM": prog, "PARALLELISM": "1", "QUEUE_LIMIT": "3"}}
    )
    d = served(conf)
    first, *_ = enqueue(conn, "a", 3)
    wait_for(lambda: counts(conn).get("failed") == 1, what="head failed")
    row = conn.execute(
        "SELECT state->>'dispatch_error' FROM pepsi.messages WHERE workqueue_id = %s", (first,)
    ).fetchone()
    assert row == ("worker exited with code 3",)
    assert d.stop() == 0


def test_claim_floors_are_lowered_by_answers_and_cleared_by_requeues(tmp_path: Path) -> None:
    """Claim floors (docs/INTERNALS.md): an answered/failed/released id X may be
    pending again at any stage, so every floor drops below X; requeued rows clear all."""
    from pepsi_dispatch.config import load_config
    from pepsi_dispatch.coordinator.database.port import Requeue
    from pepsi_dispatch.coordinator.dispatcher import Dispatcher
    from pepsi_dispatch.coordinator.ledger import OwedWrites

    conf = write_conf(tmp_path / "pepsi.conf", {"a": {"PROGRAM": "/bin/true"}})
    d = Dispatcher(load_config(str(conf)))
    ledger = d.ledger
    ledger.floors.update({"a": 100, "b": 40})
    ledger.lower_floors(OwedWrites([], [], [70, 90]))
    assert ledger.floors == {"a": 69, "b": 40}
    ledger.lower_floors(OwedWrites([60], [(50, "failed", "x")], []))
    assert ledger.floors == {"a": 49, "b": 40}
    ledger.lower_floors(OwedWrites([1], [], []))
    assert ledger.floors == {"a": 0, "b": 0}
    ledger.floors.clear()
    ledger.floors["a"] = 100
    d.flip.done(Requeue(0, 1, 0, None, (("a", 1),)), time.monotonic())
    assert ledger.floors == {"a": 100}  # failed (exhausted) rows are not pending
    # ... and they count as failed in their stage (so in dispatch_stats.failed too).
    args = d.stats.flush_args()
    assert (args["stages"], args["failed"], args["stage_runs"]) == (["a"], [1], 0)
    d.flip.done(Requeue(1, 0, 0, None), time.monotonic())
    assert ledger.floors == {}


def test_a_paused_row_requeued_below_the_claim_floor_is_claimed_promptly(
    conn: psycopg.Connection, tmp_path: Path, served: Callable[..., Served]
) -> None:
    """The first (lowest) id is paused for 1 s while the claims move on past it;
    requeued, it is pending again with the lowest id: it must be claimed at once,
    not on the POLL_INTERVAL (60 s) heartbeat."""
    prog = program("--pause-first", "a=1", "--sleep", "a=0.1")
    conf = write_conf(
        tmp_path / "pepsi.conf",
        {"a": {"PROGRAM": prog, "PARALLELISM": "1", "QUEUE_LIMIT": "2"}},
    )
    d = served(conf)
    ids = enqueue(conn, "a", 60)
    first = min(ids)

    def status() -> str:
        return conn.execute(
            "SELECT status FROM pepsi.messages WHERE workqueue_id = %s", (first,)
        ).fetchone()[0]

    wait_for(lambda: status() == "paused", timeout=30, what="the first row paused")
    paused_at = time.monotonic()
    wait_for(lambda: status() == "done", timeout=4.0, what="the paused row done within ~3 s")
    assert time.monotonic() - paused_at < 4.0
    # The backlog was still being worked through: the floor was past the row.
    assert counts(conn).get("done", 0) < 60
    wait_for(lambda: counts(conn) == {"done": 60}, timeout=60, what="60 rows done")
    assert d.stop() == 0


def test_rows_advanced_out_of_id_order_are_all_claimed_at_the_next_stage(
    conn: psycopg.Connection, tmp_path: Path, served: Callable[..., Served]
) -> None:
    """Two workers of a, odd ids slow: rows reach b out of id order, so b's claim
    floor passes ids that become pending at b later. None may wait for the heartbeat."""
    prog = program("--next", "a=b", "--sleep-odd", "a=0.2", "--sleep", "b=0.02")
    conf = write_conf(
        tmp_path / "pepsi.conf",
        {
            "a": {"PROGRAM": prog, "NEXT": "b", "PARALLELISM": "2", "QUEUE_LIMIT": "1"},
            "b": {"PROGRAM": prog, "PARALLELISM": "1", "QUEUE_LIMIT": "2"},
        },
    )
    d = served(conf)
    started = time.monotonic()
    enqueue(conn, "a", 40)
    # ~20 odd rows x 0.2 s over 2 workers: a few seconds, far below POLL_INTERVAL.
    wait_for(lambda: counts(conn) == {"done": 40}, timeout=20, what="40 rows done")
    assert time.monotonic() - started < 20
    assert d.stop() == 0


@pytest.mark.parametrize("competing", [False, True], ids=["single", "competing"])
def test_answer_checks_and_claim_in_one_statement(
    dsn: str, conn: psycopg.Connection, competing: bool
) -> None:
    """The usual busy wake -- answers to check and a claim -- is one statement:
    the row answered 0 but left running is failed and reported, the row the
    stage moved is untouched, and the claim takes the pending rows, lowest ids
    first, in the same round trip."""
    from pepsi_dispatch.coordinator.database.port import ClaimParams, RoundTripParams
    from pepsi_dispatch.coordinator.database.postgres import PostgresStore

    db = PostgresStore(dsn, competing)
    db.connect()
    try:
        did = db.register()
        ids = [
            r[0]
            for r in conn.execute(
                "SELECT pepsi.enqueue('a', jsonb_build_object('n', g)) FROM generate_series(1, 5) g"
            )
        ]
        left, moved = ids[0], ids[1]
        conn.execute(
            "UPDATE pepsi.workqueue SET status = 'running', dispatcher_id = %s"
            " WHERE workqueue_id = ANY(%s)",
            (did, [left, moved]),
        )
        assert conn.execute("SELECT pepsi.finish(%s, 'a', %s)", (moved, did)).fetchone()[0]
        result = db.round_trip(
            did, RoundTripParams([], [left, moved], None, ClaimParams(["a"], [2], None))
        )
        assert result.left_running == [(left, "a")]
        assert result.claimed == [(ids[2], "a"), (ids[3], "a")]
        status = dict(
            conn.execute(
                "SELECT workqueue_id, status FROM pepsi.messages WHERE workqueue_id = ANY(%s)",
                (ids,),
            ).fetchall()
        )
        assert status == {
            left: "failed",
            moved: "done",
            ids[2]: "running",
            ids[3]: "running",
            ids[4]: "pending",
        }
    finally:
        db.close()
