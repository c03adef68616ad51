"""pepsi-queue as a real process against a real database: show, cancel, status
--watch, failed --json / --by-reason, purge's refusal and --dry-run, a bare call,
and enqueue's --at/--in, stage check and object payloads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from dispatch_harness import Harness, harness_fixture, wait_until  # noqa: F401

EXE = Path(sys.executable).parent / "pepsi-queue"


@pytest.fixture
def pq(dsn: str, tmp_path: Path):
    """Run the pepsi-queue console script; returns the CompletedProcess."""
    if not EXE.exists():
        pytest.skip("pepsi-queue console script not installed")
    env = {
        "PEPSI_DSN": dsn,
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),  # no ~/.config/pepsi.conf of the machine
        "LANG": "C.UTF-8",
    }

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(EXE), *args], env=env, input=stdin, capture_output=True, text=True, timeout=60
        )

    run.env = env  # type: ignore[attr-defined]
    return run


def register(conn: psycopg.Connection, *stages: str) -> None:
    conn.execute(
        "SELECT pepsi.register_stages(1, %s, NULL, NULL, NULL, NULL, %s, %s)",
        (list(stages), [2] * len(stages), [4] * len(stages)),
    )


def failed_row(conn: psycopg.Connection, stage: str, reason: str) -> int:
    return conn.execute(
        "INSERT INTO pepsi.workqueue (stage, status, state) VALUES (%s, 'failed',"
        " jsonb_build_object('error', %s::text)) RETURNING workqueue_id",
        (stage, reason),
    ).fetchone()[0]


def test_bare_call_prints_normal_help(pq) -> None:
    r = pq()
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.startswith("Usage: pepsi-queue")
    for command in ("enqueue", "status", "show", "failed", "requeue", "cancel", "purge"):
        assert f"\n  {command} " in r.stdout
    assert len(r.stdout.splitlines()) > 10, "help on many lines, not one error line"


def test_enqueue_refuses_unknown_stage_unless_forced(pq, conn, tmp_path: Path) -> None:
    register(conn, "parse", "store")
    r = pq("enqueue", "prase", "{}")
    assert r.returncode == 2 and r.stdout == ""
    assert "unknown stage 'prase'" in r.stderr and "did you mean 'parse'" in r.stderr
    assert r.stderr.count("\n") == 1
    assert conn.execute("SELECT count(*) FROM pepsi.messages").fetchone() == (0,)
    assert "did you mean 'parse'? --force enqueues anyway" in r.stderr
    r = pq("enqueue", "prase", "{}", "--force")
    assert r.returncode == 0 and r.stdout.strip().isdigit()
    assert pq("enqueue", "parse", "{}").returncode == 0
    # A stage only the configuration file knows is fine too.
    conf = tmp_path / "pepsi.conf"
    conf.write_text("[stage-render]\nPROGRAM = /bin/true\n")
    assert pq("-c", str(conf), "enqueue", "render", "{}").returncode == 0
    assert pq("-c", str(conf), "enqueue", "rendr", "{}").returncode == 2


def test_enqueue_payload_must_be_an_object(pq, conn) -> None:
    for text, kind in (("42", "a number"), ("[1,2]", "an array"), ('"x"', "a string")):
        r = pq("enqueue", "a", text, "--force")
        assert r.returncode == 2, r
        assert f"argument 1 must be a JSON object ({{...}}), not {kind}" in r.stderr
    r = pq("enqueue", "a", "-", "--force", stdin='{"ok": 1}\n[3]\n')
    assert r.returncode == 2 and "stdin line 2 must be a JSON object" in r.stderr
    assert conn.execute("SELECT count(*) FROM pepsi.messages").fetchone() == (0,)


def test_enqueue_at_and_in_delay_messages(pq, conn) -> None:
    register(conn, "a")
    r = pq("enqueue", "a", '{"n": 1}', '{"n": 2}', "--in", "10min")
    assert r.returncode == 0, r.stderr
    ids = [int(x) for x in r.stdout.split()]
    rows = conn.execute(
        "SELECT status, retries, timeout - now() FROM pepsi.messages WHERE workqueue_id = ANY(%s)",
        (ids,),
    ).fetchall()
    for status, retries, wait in rows:
        assert (status, retries) == ("paused", 0)
        assert timedelta(minutes=9) < wait <= timedelta(minutes=10, seconds=5)
    at = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    r = pq("enqueue", "a", "--at", at.isoformat(), "-q")
    assert r.returncode == 0 and "not before" in r.stdout
    (timeout,) = conn.execute(
        "SELECT timeout FROM pepsi.messages ORDER BY workqueue_id DESC LIMIT 1"
    ).fetchone()
    assert timeout == at
    assert pq("enqueue", "a", "--at", "tomorrow").returncode == 2
    assert pq("enqueue", "a", "--at", at.isoformat(), "--in", "1 s").returncode == 2
    r = pq("show", str(ids[0]))
    assert "delayed" in r.stdout and "due" in r.stdout


def test_show_prints_one_message(pq, conn) -> None:
    register(conn, "s")
    mid = conn.execute(
        "INSERT INTO pepsi.workqueue (stage, status, payload, state, retries, created_at)"
        " VALUES ('s', 'failed', '{\"doc\": 7}', '{\"dispatch_error\": \"3 boom\","
        ' "retry_error": "3 boom"}\', 2, now() - interval \'2 h\') RETURNING workqueue_id'
    ).fetchone()[0]
    r = pq("show", str(mid))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith(f"message {mid}\n")
    assert "status      failed" in out and "retries     2 of 10" in out
    assert "error       3 boom" in out and "dispatch_error: 3 boom" in out
    # A retry_error of a row no longer paused is an old note: in state, not under errors.
    assert "    retry_error:" not in out
    assert '"doc": 7' in out and "(2 h 0 min ago)" in out
    story = json.loads(pq("show", str(mid), "--json").stdout)
    assert story["status"] == "failed" and "retry_error" not in story["errors"]
    assert story["history"] == []
    assert 7190 < story["age"] < 7300
    r = pq("show", "999999")
    assert r.returncode == 1 and r.stderr == "pepsi-queue: error: no message 999999\n"


def test_cancel_by_id_stage_and_all(pq, conn) -> None:
    register(conn, "a", "b")
    ids = [int(x) for x in pq("enqueue", "a", "{}", "{}", "{}").stdout.split()]
    pq("enqueue", "b", "{}", "--in", "1 h")
    r = pq("cancel")
    assert r.returncode == 2 and "say which messages" in r.stderr
    assert pq("cancel", "--all", "--stage", "a").returncode == 2
    assert pq("cancel", "--id", str(ids[0])).stdout == f"cancelled 1 message(s): {ids[0]}\n"
    assert pq("cancel", "--stage", "a", "--yes").stdout == "cancelled 2 message(s)\n"
    assert pq("cancel", "--all", "--yes").stdout == "cancelled 1 message(s)\n"
    rows = conn.execute("SELECT DISTINCT status, state->>'error' FROM pepsi.messages").fetchall()
    assert rows == [("failed", "cancelled by operator")]
    by_reason = json.loads(pq("failed", "--by-reason", "--json").stdout)
    assert [(g["stage"], g["count"]) for g in by_reason] == [("a", 3), ("b", 1)]


def test_failed_json_and_by_reason(pq, conn) -> None:
    a1 = failed_row(conn, "a", "bad input")
    a2 = failed_row(conn, "a", "bad input")
    b1 = failed_row(conn, "b", "timeout of upstream")
    rows = json.loads(pq("failed", "--json").stdout)
    assert [r["id"] for r in rows] == [b1, a2, a1]
    assert rows[0]["error"] == "timeout of upstream" and rows[0]["payload"] == {}
    r = pq("failed", "--by-reason")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert lines[1].split()[:4] == ["2", "a", "failed", "bad"]
    assert f"({a2}, {a1})" in lines[1]
    assert "timeout of upstream" in lines[2]
    assert json.loads(pq("failed", "--by-reason", "--json", "--stage", "b").stdout)[0]["ids"] == [
        b1
    ]


def test_purge_refuses_without_selection_and_has_dry_run(pq, conn) -> None:
    failed_row(conn, "a", "x")
    failed_row(conn, "b", "y")
    r = pq("purge")
    assert r.returncode == 2 and "--yes" in r.stderr and r.stderr.count("\n") == 1
    assert pq("purge", "--dry-run").stdout == "would purge 2 message(s)\n"
    assert pq("purge", "--stage", "a", "--dry-run").stdout == "would purge 1 message(s)\n"
    assert conn.execute("SELECT count(*) FROM pepsi.messages").fetchone() == (2,)
    assert pq("purge", "--stage", "a").stdout == "purged 1 message(s)\n"
    assert pq("purge", "--yes").stdout == "purged 1 message(s)\n"


def test_status_watch_refreshes_and_ctrl_c_exits_0(pq, conn) -> None:
    register(conn, "a")
    conn.execute(
        "INSERT INTO pepsi.workqueue (stage, updated_at) VALUES ('a', now() - interval '75 s')"
    )
    conn.execute("INSERT INTO pepsi.stage_stats (stage, processed) VALUES ('a', 10)")
    r = pq("status", "--watch", "--count", "2", "--interval", "0.5")
    assert r.returncode == 0, r.stderr
    frames = [f for f in r.stdout.split("\n\n") if f.startswith("pepsi-queue status --watch")]
    assert len(frames) == 2
    row = next(line for line in frames[1].splitlines() if line.startswith("a "))
    cols = row.split()
    assert cols[1] == "1"  # pending
    assert "1 min 15 s" in row or "1 min 16 s" in row  # oldest pending wait
    assert cols[-2:] == ["-", "2"]  # no live dispatcher runs it; max = PARALLELISM
    frame = json.loads(pq("status", "--watch", "--json", "--count", "1").stdout)
    (a,) = frame["stages"]
    assert (a["stage"], a["pending"], a["processed_total"]) == ("a", 1, 10)

    # Until Ctrl-C: SIGINT ends it with exit 0. As in a terminal, SIGINT's
    # disposition is the default: a test run started in the background by a
    # shell without job control inherits it ignored, and so would the watch.
    proc = subprocess.Popen(
        [str(EXE), "status", "--watch", "--interval", "0.2"],
        env=pq.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        # Ctrl-C once two frames were drawn (the loop runs), not at a guessed moment.
        assert proc.stdout is not None
        head = ""
        while head.count("pepsi-queue status --watch") < 2:
            line = proc.stdout.readline()
            assert line, "the watch ended before its second frame"
            head += line
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert (head + out).count("pepsi-queue status --watch") >= 2 and "Traceback" not in err


def test_status_watch_shows_the_live_workers_of_a_running_dispatcher(pq, h: Harness) -> None:
    """The workers column comes from a running dispatcher's heartbeat gauges
    (pepsi.queue_overview v2), checked against its worker processes in /proc."""
    stages = h.pipeline(["a"], PARALLELISM=3, QUEUE_LIMIT=1)
    d = h.start(h.conf(stages, poll_interval="1 s"))  # a heartbeat (with gauges) every second
    h.enqueue("a", [{"do": "sleep:60"}] * 2)

    def stage_a() -> dict:
        r = pq("status", "--watch", "--json", "--count", "1")
        assert r.returncode == 0, r.stderr
        (a,) = [st for st in json.loads(r.stdout)["stages"] if st["stage"] == "a"]
        return a

    def two_busy() -> dict | None:
        a = stage_a()
        procs = len(d.workers().get("a", []))
        return a if a["workers_busy"] == 2 and a["workers"] == procs else None

    a = wait_until(two_busy, 30, 0.2, lambda: f"2 busy workers shown: {stage_a()}\n{d.tail()}")
    assert (a["dispatchers"], a["running"], a["parallelism"]) == (1, 2, 3)
    assert (
        a["workers"]
        == a["workers_busy"] + a["workers_idle"] + a["workers_retiring"] + a["workers_stopping"]
    )
    text = pq("status", "--watch", "--count", "1").stdout
    row = next(line for line in text.splitlines() if line.startswith("a "))
    assert row.split()[-2:] == [f"2/{a['workers']}", "3"], text

    # Stopped, the dispatcher unregisters: no live workers, none shown.
    assert d.terminate() == 0
    a = stage_a()
    assert (a["dispatchers"], a["workers"]) == (0, 0)
    row = next(
        line
        for line in pq("status", "--watch", "--count", "1").stdout.splitlines()
        if line.startswith("a ")
    )
    assert row.split()[-2:] == ["-", "3"]


def test_requeue_wakes_the_dispatcher_through_a_notification(pq, dsn, conn) -> None:
    failed_row(conn, "a", "x")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN workqueue")
        assert pq("requeue", "--all", "--yes").stdout == "requeued 1 message(s)\n"
        assert [n.channel for n in listener.notifies(timeout=2, stop_after=1)] == ["workqueue"]


def test_watch_in_a_terminal_refreshes_in_place(dsn, tmp_path: Path) -> None:
    """On a terminal the frames redraw in place (cursor home + clear), no scrolling."""
    if not EXE.exists():
        pytest.skip("pepsi-queue console script not installed")
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: pepsi-queue on the pty
        os.execve(
            str(EXE),
            [str(EXE), "status", "--watch", "--count", "2", "--interval", "0.2"],
            {"PEPSI_DSN": dsn, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        )
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert out.count(b"\x1b[H\x1b[2J") == 2


def test_ids_past_bigint_are_usage_errors(pq, conn) -> None:
    # They reached PostgreSQL as numeric: "function pepsi.message_story(numeric)
    # does not exist", a database error instead of a word about the id.
    huge = str(2**63)
    for args in (("show", huge), ("cancel", "--id", huge), ("requeue", "--id", huge)):
        r = pq(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert huge in r.stderr and "numeric" not in r.stderr, (args, r.stderr)
    r = pq("show", "0")
    assert r.returncode == 2 and "is not in the range" in r.stderr, r.stderr


def test_migrate_sql_from_a_revision_is_an_upgrade_script(pq) -> None:
    # OPERATIONS.md's upgrade step says "--sql prints the DDL for review", but it
    # always printed the DDL from an empty database: useless (and failing) for a
    # database that is already at an older revision.
    full = pq("migrate", "--sql")
    assert full.returncode == 0 and "CREATE TABLE alembic_version" in full.stdout
    r = pq("migrate", "--sql", "--from", "0013")
    assert r.returncode == 0, r.stderr
    assert "CREATE TABLE alembic_version" not in r.stdout
    assert "CREATE TABLE pepsi.workqueue" not in r.stdout
    bump = "UPDATE alembic_version SET version_num='0014' WHERE"
    assert f"{bump} alembic_version.version_num = '0013'" in r.stdout
    assert "Running upgrade 0013 -> 0014" in r.stderr
    r = pq("migrate", "--from", "0013")
    assert r.returncode == 2 and "--from needs --sql" in r.stderr, r.stderr


def test_an_unknown_stage_with_nothing_close_has_no_empty_hint(pq, conn) -> None:
    register(conn, "parse", "store")
    r = pq("failed", "--stage", "zzz")
    assert r.returncode == 2
    line = r.stderr.splitlines()[0]
    assert "unknown stage 'zzz'" in line and "(known: parse, store)" in line
    assert ");" not in line and ";;" not in line and "; (" not in line, line
