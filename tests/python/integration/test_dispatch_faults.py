"""Faults an adversarial operator can throw at the real dispatcher.

Each test runs a real `pepsi-dispatch serve`, real worker processes and real signals
against the session's PostgreSQL, and would fail on the dispatcher before these fixes.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from dispatch_harness import (  # noqa: F401
    PYTHON,
    WORKERS,
    Harness,
    harness_fixture,
    pid_alive,
    wait_until,
)

FAULT = WORKERS / "fault_worker.py"
SDK_WORKER = Path(__file__).resolve().parents[1] / "support" / "workers" / "sdk_scripted_worker.py"


def fault_program(h: Harness, first: str, wait_for: Path | None = None) -> tuple[str, Path]:
    """PROGRAM of fault_worker.py doing `first` once; returns it and its marker path."""
    marker = h.tmp / f"marker-{first.replace(':', '-').replace(',', '-')}"
    parts = [str(PYTHON), str(FAULT), "--marker", str(marker), "--first", first]
    if wait_for is not None:
        parts += ["--wait-for", str(wait_for)]
    return " ".join(parts), marker


def error_of(row: dict) -> str:
    return str((row["state"] or {}).get("dispatch_error", ""))


def in_log(d, text: str, timeout: float = 30) -> None:
    wait_until(lambda: text in d.log(), timeout, 0.1, lambda: f"{text!r} in the log:\n{d.tail()}")


# ------------------------------------------------------------ 4: one answer line


def test_answer_with_a_huge_number_is_a_protocol_error(h: Harness) -> None:
    program, _ = fault_program(h, "bignum")
    d = h.start(h.conf({"a": {"PROGRAM": program, "PARALLELISM": 1, "QUEUE_LIMIT": 1}}))
    first, second = h.enqueue("a", 2)
    h.wait_all(timeout=60)
    row = h.row(first)
    assert row["status"] == "failed", row
    assert "protocol error" in error_of(row), row
    assert h.row(second)["status"] == "done"
    assert d.running(), d.tail()
    assert d.terminate() == 0


def test_reloaded_integer_with_thousands_of_digits_is_a_clean_reload_failure(
    h: Harness,
) -> None:
    d = h.start(h.conf(h.pipeline(["a"])))
    h.set_config("stage-a", "MAX_RETRIES", "9" * 5000)
    rc = d.wait_exit(30)
    log = d.log()
    assert "reloaded configuration does not parse" in log, log[-3000:]
    assert "out of range" in log
    assert "Traceback" not in log, log[-3000:]
    assert rc == 1


# ------------------------------------------------------------ 6: exit 75


def test_exit_75_releases_every_message_and_fails_none(h: Harness) -> None:
    program, marker = fault_program(h, "exit:75")
    d = h.start(h.conf({"a": {"PROGRAM": program, "PARALLELISM": 1, "QUEUE_LIMIT": 3}}))
    ids = h.enqueue("a", 3)
    h.wait_all(timeout=60)
    assert marker.exists()
    for i in ids:
        row = h.row(i)
        assert row["status"] == "done", row
        assert row["retries"] == 0 and "dispatch_error" not in (row["state"] or {}), row
    assert "could not reach the database (exit 75)" in d.log()
    assert "holding off new workers" in d.log()
    assert d.terminate() == 0
    stats = h.stage_stats().get("a", {})
    assert stats.get("crashes", 0) == 0 and stats.get("failed", 0) == 0, stats


def _allow_connections(h: Harness, admin_dsn: str, allow: bool) -> None:
    """Let new sessions into the test's database, or refuse them (existing ones stay)."""
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(
            f'ALTER DATABASE "{h.conn.info.dbname}" ALLOW_CONNECTIONS {str(allow).lower()}'
        )


def _terminate(h: Harness, app_like: str) -> int:
    row = h.conn.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND application_name LIKE %s",
        (app_like,),
    ).fetchone()
    return int(row[0])


def _sessions(h: Harness, app: str) -> int:
    row = h.conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = %s",
        (app,),
    ).fetchone()
    return int(row[0])


def test_sdk_worker_that_cannot_reconnect_exits_75_and_its_message_is_released(
    h: Harness, pg_admin_dsn: str
) -> None:
    program = f"{PYTHON} {SDK_WORKER} --stages a"
    conf = h.conf({"a": {"PROGRAM": program, "PARALLELISM": 1, "QUEUE_LIMIT": 1}})
    d = h.start(conf, env={"PEPSI_WORKER_RECONNECT_TIMEOUT": "1"})
    try:
        (wid,) = h.enqueue("a", [{"plan": {"a": {"op": "finish", "sleep": 3}}}])
        wait_until(lambda: h.row(wid)["status"] == "running", 30)
        wait_until(lambda: _sessions(h, "pepsi-worker a"), 30, message="the worker's session")
        _allow_connections(h, pg_admin_dsn, False)
        # The worker is inside the message (its handler sleeps 3 s); cut its
        # session (and the spare its template may keep for the next worker:
        # dropped, not lent, once the server ended it).
        assert _terminate(h, "pepsi-worker%") >= 1
        in_log(d, "could not reach the database (exit 75)")
    finally:
        _allow_connections(h, pg_admin_dsn, True)
    h.wait_all(timeout=90)
    row = h.row(wid)
    assert row["status"] == "done", row
    assert row["retries"] == 0 and "dispatch_error" not in (row["state"] or {}), row
    assert "crashed" not in d.log()
    assert d.terminate() == 0


def test_worker_exiting_while_the_dispatcher_is_offline_has_its_messages_released(
    h: Harness, pg_admin_dsn: str
) -> None:
    go = h.tmp / "go"
    program, marker = fault_program(h, "exit:3", wait_for=go)
    d = h.start(h.conf({"a": {"PROGRAM": program, "PARALLELISM": 1, "QUEUE_LIMIT": 2}}))
    ids = h.enqueue("a", 2)
    wait_until(marker.exists, 30, message="the worker holds its first message")
    try:
        _allow_connections(h, pg_admin_dsn, False)
        wait_until(lambda: _terminate(h, "pepsi-dispatch%"), 15, message="dispatcher sessions")
        in_log(d, "database trouble")
        go.touch()  # now the worker exits 3 with both messages unanswered
        in_log(d, "while the database is unreachable")
    finally:
        _allow_connections(h, pg_admin_dsn, True)
    h.wait_all(timeout=90)
    for i in ids:
        row = h.row(i)
        assert row["status"] == "done", row
        assert "dispatch_error" not in (row["state"] or {}), row
    assert d.terminate() == 0


# ------------------------------------------------------------ 3: the process tree


def _wrapper(h: Harness, seconds: float) -> str:
    """A shell wrapper that runs one child script per message (the child sleeps)."""
    one = h.tmp / "one.sh"
    one.write_text(
        textwrap.dedent(f"""\
            #!/bin/bash
            echo $$ > {h.tmp}/child-$1
            sleep {seconds}
            sql="select pepsi.finish($1, '$PEPSI_STAGE', $PEPSI_DISPATCHER_ID)"
            psql "$PEPSI_DSN" -X -qAtc "$sql" >/dev/null
            """)
    )
    one.chmod(0o755)
    wrapper = h.tmp / "wrapper.sh"
    wrapper.write_text(
        textwrap.dedent(f"""\
            #!/bin/bash
            echo $$ > {h.tmp}/wrapper-pid
            while read id; do {one} "$id" && echo 0; done
            """)
    )
    wrapper.chmod(0o755)
    return f"/bin/bash {wrapper}"


def _child_pid(h: Harness, wid: int) -> int:
    path = h.tmp / f"child-{wid}"
    wait_until(lambda: path.exists() and path.read_text().strip(), 30, message=str(path))
    return int(path.read_text())


def test_graceful_stop_ends_the_workers_children_too(h: Harness) -> None:
    d = h.start(h.conf({"a": {"PROGRAM": _wrapper(h, 60), "PARALLELISM": 1}}))
    (wid,) = h.enqueue("a", 1)
    child = _child_pid(h, wid)
    assert d.terminate() == 0
    wait_until(lambda: not pid_alive(child), 10, message=f"child {child} of the wrapper ends")
    assert h.row(wid)["status"] == "pending"


def test_a_dead_workers_group_is_killed_before_its_ids_are_released(h: Harness) -> None:
    d = h.start(h.conf({"a": {"PROGRAM": _wrapper(h, 60), "PARALLELISM": 1}}))
    (wid,) = h.enqueue("a", 1)
    child = _child_pid(h, wid)
    wrapper = int((h.tmp / "wrapper-pid").read_text())
    os.kill(wrapper, signal.SIGKILL)
    wait_until(lambda: not pid_alive(child), 10, message=f"child {child} of the dead wrapper ends")
    # The head-of-line message failed as a crash; nothing of it runs on anywhere.
    wait_until(lambda: h.row(wid)["status"] == "failed", 30)
    assert d.running()
    assert d.terminate() == 0


def test_dispatcher_is_a_subreaper_and_reaps_escaped_grandchildren(h: Harness) -> None:
    escaper = h.tmp / "escaper.py"
    escaper.write_text(
        textwrap.dedent(f"""\
            import os, sys, time, psycopg
            conn = psycopg.connect(os.environ["PEPSI_DSN"], autocommit=True)
            for line in sys.stdin:
                wid = int(line)
                escaped_r, escaped_w = os.pipe()
                if os.fork() == 0:
                    os.setsid()  # leaves the worker's process group
                    with open("{h.tmp}/escaped", "w") as f:
                        f.write(str(os.getpid()))
                    os.write(escaped_w, b"x")
                    time.sleep(3)
                    os._exit(0)
                # Answer only once the child is out of the group: the worker's exit
                # SIGKILLs its group, which would take a child still in it along.
                os.close(escaped_w)
                os.read(escaped_r, 1)
                conn.execute("select pepsi.finish(%s, %s, %s)", (wid, os.environ["PEPSI_STAGE"],
                             int(os.environ["PEPSI_DISPATCHER_ID"])))
                print(0, flush=True)
                os._exit(0)  # the worker goes; its escaped child is an orphan now
            """)
    )
    d = h.start(h.conf({"a": {"PROGRAM": f"{PYTHON} {escaper}", "PARALLELISM": 1}}))
    (wid,) = h.enqueue("a", 1)
    path = h.tmp / "escaped"
    wait_until(lambda: path.exists() and path.read_text(), 30, message="escaped child")
    pid = int(path.read_text())

    def parent() -> int | None:
        try:
            return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            return None

    wait_until(lambda: parent() == d.pid, 10, message=lambda: f"ppid {parent()} of {pid}")
    # It exits after 3 s: the dispatcher reaps it (no zombie stays behind).
    wait_until(lambda: not Path(f"/proc/{pid}").exists(), 20, message=f"{pid} reaped")
    assert h.row(wid)["status"] == "done"
    assert d.running()
    assert d.terminate() == 0


# ------------------------------------------------------------ pure pieces


def test_parse_answer_never_raises_on_long_numbers() -> None:
    from pepsi_dispatch.coordinator.workers.answers import AnswerKind, parse_answer

    assert parse_answer(b"9" * 5000 + b" why").kind is AnswerKind.PROTOCOL_ERROR
    assert parse_answer(b"0" * 5000).kind is AnswerKind.PROTOCOL_ERROR
    assert parse_answer(b"9" * 4300 + b" why").kind is AnswerKind.FAILED
    assert parse_answer(b"-000 fused=b").kind is AnswerKind.OK
    assert parse_answer(b"+007 x").kind is AnswerKind.FAILED


@pytest.mark.parametrize(
    ("killed", "stopping", "shutting", "rc", "unanswered", "undelivered", "started", "db", "kind"),
    [
        (True, False, False, -9, 2, 0, True, True, "KILLED"),
        (False, True, True, -15, 2, 0, True, True, "STOPPED"),
        (False, False, False, 75, 2, 0, True, True, "TEMPFAIL"),
        (False, False, False, 75, 0, 0, False, True, "TEMPFAIL"),
        (False, False, False, 1, 2, 0, False, True, "DIED_BEFORE_READING"),
        (False, False, False, 1, 0, 1, False, True, "DIED_BEFORE_READING"),
        (False, True, False, 0, 0, 0, True, True, "STOPPED"),
        (False, False, False, 0, 0, 0, True, True, "EXITED"),
        (False, False, False, 3, 2, 0, True, False, "DB_DOWN"),
        (False, False, False, 3, 2, 0, True, True, "CRASH"),
        (False, False, False, -11, 1, 0, True, True, "CRASH"),
        # exit 78: the stage is not in the worker's configuration; nothing fails
        (False, False, False, 78, 2, 0, False, True, "NO_STAGE"),
        (False, False, False, 78, 1, 0, True, True, "NO_STAGE"),
        (True, False, False, 78, 1, 0, True, True, "KILLED"),
    ],
)
def test_classify_exit(
    killed: bool,
    stopping: bool,
    shutting: bool,
    rc: int,
    unanswered: int,
    undelivered: int,
    started: bool,
    db: bool,
    kind: str,
) -> None:
    from pepsi_dispatch.coordinator.workers.process import ExitKind, classify_exit

    got = classify_exit(
        rc,
        killed=killed,
        stopping=stopping,
        shutting_down=shutting,
        unanswered=unanswered,
        undelivered=undelivered,
        started=started,
        db_connected=db,
    )
    assert got is ExitKind[kind]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[stage-a]\nPROGRAM = /bin/a\nMAX_RETRIES = 99999999999\n", ":3: [stage-a] MAX_RETRIES"),
        ("[stage-a]\nPROGRAM = /bin/a\nPARALLELISM = 2147483648\n", ":3: [stage-a] PARALLELISM"),
        ("[stage-a]\nPROGRAM = /bin/a\nQUEUE_LIMIT = " + "9" * 5000 + "\n", ":3: [stage-a]"),
        ("[pepsi-dispatch]\nDB_POOL_SIZE = 4294967296\n", ":2: [pepsi-dispatch] DB_POOL_SIZE"),
    ],
)
def test_integer_options_are_bounded(tmp_path: Path, text: str, fragment: str) -> None:
    from pepsi_dispatch.config import ConfigError, load_config

    path = tmp_path / "pepsi.conf"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert fragment in msg and "out of range" in msg and "2147483647" in msg, msg


def test_parallelism_times_queue_limit_above_an_int4_claims_int_max_at_most(h: Harness) -> None:
    """PARALLELISM x QUEUE_LIMIT is the claim size, an int4 in the database. Integer
    options take their whole range; a product above it asks for 2,147,483,647 ids at
    most, so the claim is never poisoned: messages flow."""
    stages = h.pipeline(["a"])
    stages["a"].update(PARALLELISM=2, QUEUE_LIMIT=2147483647)
    h.start(h.conf(stages))
    h.enqueue("a", 5)
    assert h.wait_all(timeout=60) == {"done": 5}


# ------------------------------------------------------------ 1: one poisoned statement


def test_a_row_paused_until_infinity_stops_nothing(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a", "b"])))
    (parked,) = h.enqueue("b", 1)
    (soon,) = h.enqueue("b", 1)
    wait_until(lambda: h.row(parked)["status"] == "done" and h.row(soon)["status"] == "done", 30)
    # Park one row for ever and another for a second, behind the dispatcher's back
    # (pepsi.pause refuses 'infinity'; an UPDATE does not).
    h.conn.execute(
        "UPDATE pepsi.workqueue SET status = 'paused', timeout = 'infinity', stage = 'b'"
        " WHERE workqueue_id = %s",
        (parked,),
    )
    h.conn.execute(
        "UPDATE pepsi.workqueue SET status = 'paused', timeout = now() + interval '1 s',"
        " stage = 'b' WHERE workqueue_id = %s",
        (soon,),
    )
    fresh = h.enqueue("a", 3)  # a requeue_due runs with the claim of these
    h.wait_all(timeout=60, where=f"workqueue_id <> {parked}")
    assert [h.row(i)["status"] for i in fresh] == ["done"] * 3
    assert h.row(soon)["status"] == "done" and h.row(soon)["retries"] == 1
    status = h.conn.execute(
        "SELECT status FROM pepsi.messages WHERE workqueue_id = %s", (parked,)
    ).fetchone()
    assert status == ("paused",)
    assert d.running()
    assert d.terminate() == 0


POISON = """
CREATE FUNCTION public.poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF {condition} THEN
        RAISE EXCEPTION 'poisoned row %', NEW.workqueue_id;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER poison BEFORE UPDATE ON pepsi.workqueue
    FOR EACH ROW EXECUTE FUNCTION public.poison();
"""


def test_a_stage_whose_claim_fails_stops_only_itself(h: Harness) -> None:
    h.conn.execute(
        POISON.format(condition="NEW.stage = 'bad' AND NEW.status = 'running'")  # type: ignore[arg-type]
    )
    program = h.program()
    d = h.start(h.conf({"good": {"PROGRAM": program}, "bad": {"PROGRAM": program}}))
    bad = h.enqueue("bad", 2)
    good = h.enqueue("good", 3)
    h.wait_all(timeout=60, where="stage = 'good'")
    assert [h.row(i)["status"] for i in good] == ["done"] * 3
    assert [h.row(i)["status"] for i in bad] == ["pending"] * 2
    in_log(d, "stage bad: claim failed")
    h.conn.execute("DROP TRIGGER poison ON pepsi.workqueue")
    h.wait_all(timeout=90)  # after the cooldown, the stage works again
    assert [h.row(i)["status"] for i in bad] == ["done"] * 2
    assert d.terminate() == 0


def test_a_row_whose_failure_cannot_be_written_is_failed_with_why(h: Harness) -> None:
    h.conn.execute(
        POISON.format(condition="NEW.state->>'dispatch_error' = '3 scripted failure'")  # type: ignore[arg-type]
    )
    d = h.start(h.conf(h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=4)))
    poisoned, *others = h.enqueue("a", [{"do": "fail"}, {}, {}, {}])
    h.wait_all(timeout=60)
    row = h.row(poisoned)
    assert row["status"] == "failed", row
    assert error_of(row).startswith("dispatch error: its failed could not be recorded"), row
    assert "poisoned row" in error_of(row)
    assert [h.row(i)["status"] for i in others] == ["done"] * 3
    assert "running its parts one by one" in d.log()
    more = h.enqueue("a", 2)  # and it goes on serving
    h.wait_all(timeout=60)
    assert [h.row(i)["status"] for i in more] == ["done"] * 2
    assert d.terminate() == 0


# ------------------------------------------------------------ 2: competing, graceful stop


def test_a_stopping_replica_keeps_heartbeating_until_it_unregisters(h: Harness) -> None:
    conf = h.conf(
        h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=1),
        COMPETING="YES",
        ORPHAN_TIMEOUT="3 s",
        SHUTDOWN_TIMEOUT="15 s",
    )
    first = h.start(conf)
    in_log(first, "SHUTDOWN_TIMEOUT (15 s) >= ORPHAN_TIMEOUT (3 s)")
    (wid,) = h.enqueue("a", [{"do": "sleep:8;next"}])
    wait_until(lambda: h.wlog().runs_of(wid), 30, message="the message starts")
    second = h.start(conf)
    first.proc.send_signal(signal.SIGTERM)  # its worker finishes the message (8 s)
    assert first.wait_exit(40) == 0
    h.wait_all(timeout=30)
    assert h.row(wid)["status"] == "done"
    assert len(h.wlog().runs_of(wid)) == 1, h.wlog().runs_of(wid)
    assert h.overlaps() == []
    assert "orphaned running row" not in second.log(), second.log()
    assert second.terminate() == 0


# ------------------------------------------------ 7: a replica declared dead, a reconnect


def _worker_pid_of(h: Harness, wid: int) -> int:
    runs = wait_until(lambda: h.wlog().runs_of(wid), 30, message=f"message {wid} starts")
    return runs[0].pid


def test_a_replica_declared_dead_kills_its_workers_before_registering_again(
    h: Harness,
) -> None:
    conf = h.conf(
        h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=1),
        COMPETING="YES",
        ORPHAN_TIMEOUT="2 s",
        SHUTDOWN_TIMEOUT="1 s",
    )
    first = h.start(conf)
    # (busy when its replica is stopped; the other replica's run goes on at once)
    (wid,) = h.enqueue("a", [{"do": "sleep_first:20;next"}])
    old_worker = _worker_pid_of(h, wid)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = h.start(conf)
        # (at its start-up, or on one of its heartbeats)
        in_log(second, "orphaned running row(s)")
    finally:
        os.kill(first.pid, signal.SIGCONT)
    in_log(first, "declared dead")
    wait_until(lambda: not pid_alive(old_worker), 10, message="the old worker is killed")
    assert first.running() and second.running()
    h.wait_all(timeout=60)
    assert h.row(wid)["status"] == "done"
    assert len(h.wlog().runs_of(wid)) == 2  # the killed run and the other replica's
    assert first.terminate() == 0
    assert second.terminate() == 0


# ------------------------------------------------------------ 5: files and privileges


def test_a_reconnect_reads_only_the_overlay_never_the_file(h: Harness) -> None:
    conf = h.conf(h.pipeline(["a"]))
    d = h.start(conf)
    first = h.enqueue("a", 2)
    h.wait_all(timeout=30)
    conf.write_text("[stage-a\nPROGRAM = half edited")  # an editor mid-save
    wait_until(lambda: _terminate(h, "pepsi-dispatch%"), 15, message="dispatcher sessions")
    in_log(d, "database connection re-established")
    more = h.enqueue("a", 2)
    h.wait_all(timeout=60)
    assert [h.row(i)["status"] for i in first + more] == ["done"] * 4
    assert d.running(), d.tail()
    assert "does not parse" not in d.log()
    assert d.terminate() == 0


needs_nobody = pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/etc/passwd").read_text().count("\nnobody:"),
    reason="needs root and a 'nobody' account",
)


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A scratch directory every user can traverse (pytest's tmp_path is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="pepsi-faults-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _serve_as_nobody(tmp: Path, extra_args: list[str]) -> tuple[int, str]:
    import subprocess

    from dispatch_harness import DISPATCH

    r = subprocess.run(
        [str(DISPATCH), "-c", str(tmp / "main.conf"), *extra_args, "serve"],
        env={**os.environ, "PEPSI_DSN": "host=/nonexistent dbname=nothing"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    return r.returncode, r.stderr


@needs_nobody
def test_an_included_file_unreadable_after_the_privilege_drop_is_exit_2(open_tmp: Path) -> None:
    tmp_path = open_tmp
    (tmp_path / "main.conf").write_text(
        "[pepsi-dispatch]\nSERVICE_USER = nobody\n@INLINE@ inc.conf\n"
    )
    (tmp_path / "main.conf").chmod(0o644)
    (tmp_path / "inc.conf").write_text("[stage-a]\nPROGRAM = /bin/cat\n")
    (tmp_path / "inc.conf").chmod(0o600)
    rc, err = _serve_as_nobody(tmp_path, [])
    assert rc == 2, err
    assert f"configuration file '{tmp_path / 'inc.conf'}' is not readable" in err, err


@needs_nobody
def test_a_log_file_the_service_user_cannot_reopen_is_exit_2(open_tmp: Path) -> None:
    tmp_path = open_tmp
    (tmp_path / "main.conf").write_text("[pepsi-dispatch]\nSERVICE_USER = nobody\n")
    (tmp_path / "main.conf").chmod(0o644)
    logfile = tmp_path / "pepsi.log"
    logfile.touch(0o644)
    rc, err = _serve_as_nobody(tmp_path, ["-l", str(logfile)])
    assert rc == 2, err
    assert "is not writable" in err, err


def test_a_config_change_that_changes_nothing_keeps_the_workers(h: Harness) -> None:
    d = h.start(
        h.conf(h.pipeline(["a"], PARALLELISM=1), WORKER_IDLE_TIMEOUT="60 s"),
    )
    h.enqueue("a", 2)
    h.wait_all(timeout=30)
    (worker,) = wait_until(lambda: d.workers().get("a"), 10, message="one worker")
    h.set_config("stage-a", "PARALLELISM", "1")  # the value it already has
    in_log(d, "nothing changed, workers kept")
    h.enqueue("a", 2)
    h.wait_all(timeout=30)
    assert pid_alive(worker) and d.workers().get("a") == [worker]
    h.set_config("stage-a", "PARALLELISM", "2")  # a real change still retires it
    in_log(d, "retiring 1 worker(s)")
    wait_until(lambda: not pid_alive(worker), 10, message="the worker retired")
    assert d.terminate() == 0


def test_a_stage_removed_and_added_again_never_exceeds_parallelism(h: Harness) -> None:
    program = h.program()
    both = {"a": {"PROGRAM": program, "PARALLELISM": 1}, "keep": {"PROGRAM": program}}
    conf = h.conf(both)
    d = h.start(conf)
    (slow,) = h.enqueue("a", [{"do": "sleep:6;next"}])
    old_worker = _worker_pid_of(h, slow)
    h.conf({"keep": {"PROGRAM": program}})  # stage a removed ...
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: d.log().count("configuration reloaded") >= 1, 10)
    h.conf(both)  # ... and added again while its old worker still runs
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: d.log().count("configuration reloaded") >= 2, 10)
    more = h.enqueue("a", 2)
    most = 0
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline and h.row(more[-1])["status"] != "done":
        most = max(most, len(d.workers().get("a", [])))
        time.sleep(0.02)
    assert most <= 1, f"{most} workers for stage a with PARALLELISM = 1"
    h.wait_all(timeout=60)
    for i in more:
        (run,) = h.wlog().runs_of(i)
        assert run.pid != old_worker
    assert d.terminate() == 0


def test_fused_stages_outside_the_graph_are_not_counted(h: Harness) -> None:
    program, _ = fault_program(h, "fused:b,nosuch")
    d = h.start(
        h.conf(
            {
                "a": {"PROGRAM": program, "PARALLELISM": 1, "NEXT": "b"},
                "b": {"PROGRAM": program},
                "c": {"PROGRAM": program},
            }
        )
    )
    h.enqueue("a", 2)
    h.wait_all(timeout=30)
    d.proc.send_signal(signal.SIGTERM)  # flushes the stats
    assert d.wait_exit(30) == 0
    stats = h.stage_stats()
    assert "nosuch" not in stats, stats
    assert stats["a"]["processed"] == 2, stats
    assert stats.get("b", {}).get("processed", 0) == 0, stats
    assert "not a successor" in d.log()


def test_a_lost_reply_to_a_committed_claim_fails_no_healthy_row(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row X was answered 0 at stage a (its check owed), advanced to b, and claimed
    again by a claim whose reply was lost with the connection; row Y was answered 0
    at a but really left running there. After the reconnect X must go back to
    pending (not be failed as "left running"); Y must still be failed."""
    from pepsi_dispatch.config import load_config
    from pepsi_dispatch.coordinator.dispatcher import Dispatcher

    monkeypatch.setenv("PEPSI_DSN", dsn)
    conf = tmp_path / "pepsi.conf"
    conf.write_text("[pepsi-dispatch]\nSERVICE_USER = root\n[stage-a]\nPROGRAM = /bin/true\n")
    d = Dispatcher(load_config(str(conf)))
    d.start()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            x, y = (
                conn.execute(
                    "INSERT INTO pepsi.workqueue (stage, payload, status, dispatcher_id)"
                    " VALUES (%s, '{}', 'running', %s) RETURNING workqueue_id",
                    (stage, d.dispatcher_id),
                ).fetchone()[0]
                for stage in ("b", "a")
            )
            d.ledger.answered(x, "a")
            d.ledger.answered(y, "a")
            d.db.close()
            d.link.lost(time.monotonic(), psycopg.OperationalError("link down"))
            d._reconnect(time.monotonic())
            assert d.link.connected
            d._database_work(time.monotonic())

            def status(i: int) -> str:
                return conn.execute(
                    "SELECT status FROM pepsi.messages WHERE workqueue_id = %s", (i,)
                ).fetchone()[0]

            assert status(x) == "pending"
            assert status(y) == "failed"
    finally:
        for w in d.supervisor.all():
            w.wait_dead()
        d.db.close()


def test_an_unexpected_error_with_one_workers_output_kills_that_worker_only(
    tmp_path: Path,
) -> None:
    from pepsi_dispatch.config import load_config
    from pepsi_dispatch.coordinator.dispatcher import Dispatcher

    conf = tmp_path / "pepsi.conf"
    conf.write_text("[stage-a]\nPROGRAM = /bin/true\n")
    d = Dispatcher(load_config(str(conf)))

    class Broken:
        stage, pid, killed, stopping, stdin_fd = "a", 4242, False, False, None

        def read_answers(self) -> list[bytes]:
            raise RuntimeError("a bug")

        def read_stderr(self) -> list[str]:
            raise RuntimeError("another bug")

        def kill(self) -> None:
            self.killed = True

        def close_stdin(self) -> None:
            pass

    sup = d.supervisor
    for what, handle in (("answers", sup._on_stdout), ("stderr", sup._on_stderr)):
        w = Broken()
        sup.on_ready(w, what, handle)(time.monotonic())  # type: ignore[arg-type]
        assert w.killed


def test_a_paused_row_for_an_unknown_stage_never_stops_the_dispatcher(h: Harness) -> None:
    """A [stage-X] PAUSED row for a stage the file does not define (written by a
    dashboard pause before the database refused those, or left behind when the stage
    was dropped) is a section without a PROGRAM: the reload did not parse and the
    dispatcher exited 1, and every restart exited 2 while the row stayed. It is
    ignored with a warning; the dispatcher keeps serving its stages, and restarts."""
    conf = h.conf(h.pipeline(["a", "b"]))
    d = h.start(conf)
    h.set_config("stage-ghost", "PAUSED", "yes")  # notifies config_changed: a reload
    wait_until(
        lambda: "[stage-ghost] has only PAUSED" in d.log() or not d.running(),
        30,
        0.1,
        lambda: "the reload\n" + d.tail(),
    )
    assert d.running(), d.tail()
    ids = h.enqueue("a", 3)
    h.wait_all(where=f"workqueue_id <= {max(ids)}")
    assert [h.row(i)["status"] for i in ids] == ["done"] * 3
    assert d.terminate() == 0
    d2 = h.start(conf)  # a restart with the row still there
    assert d2.running(), d2.tail()
    assert "[stage-ghost] has only PAUSED and no PROGRAM" in d2.log()
    more = h.enqueue("a", 2)
    h.wait_all(where=f"workqueue_id <= {max(more)}")
    assert [h.row(i)["status"] for i in more] == ["done"] * 2
