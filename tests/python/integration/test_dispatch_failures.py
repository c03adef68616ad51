"""The real dispatcher when stages misbehave: crashes, hangs, garbage, rows left running,
a PROGRAM that does not exist, and the retry policy (paused rows, retry cap, expiry).
"""

from __future__ import annotations

import os
import re
import time

import pytest
from dispatch_harness import (  # noqa: F401
    Harness,
    harness_fixture,
    pid_alive,
    proc_cmdline,
    wait_until,
)


def error_of(row: dict) -> str:
    return str(row["state"].get("dispatch_error", ""))


@pytest.mark.parametrize(
    "action, pattern",
    [
        ("exit:3", r"(exit|code|status)\D{0,20}\b3\b"),
        ("segv", r"SIGSEGV|signal\s*11"),
    ],
    ids=["exit-code", "segv"],
)
def test_crash_fails_head_and_requeues_the_rest(h: Harness, action: str, pattern: str) -> None:
    d = h.start(h.conf(h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=4)))
    head, *rest = h.enqueue("a", [{"do": action}, {}, {}, {}])
    h.wait_all(timeout=30)
    row = h.row(head)
    assert row["status"] == "failed", row
    assert re.search(pattern, error_of(row), re.I), f"dispatch_error {error_of(row)!r}"
    assert [h.row(i)["status"] for i in rest] == ["done"] * 3
    log = h.wlog()
    (crashed_pid,) = {r.pid for r in log.runs_of(head)}
    assert not pid_alive(crashed_pid)
    # the rest never ran in the crashed worker: they went back to pending, then ran elsewhere
    for i in rest:
        assert [r.pid for r in log.runs_of(i)] != [crashed_pid]
        assert len(log.runs_of(i)) == 1
    assert h.overlaps() == []
    wait_until(
        lambda: h.stage_stats().get("a", {}).get("crashes") == 1,
        10,
        message=lambda: f"crash counted in stage_stats: {h.stage_stats()}",
    )
    wait_until(
        lambda: h.dispatch_stats()["crashes"] == 1,
        10,
        message=lambda: f"crash counted in dispatch_stats: {h.dispatch_stats()}",
    )
    assert d.running()
    assert d.terminate() == 0


def test_hang_times_out(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=3), MAX_RUNTIME="1 s"))
    t0 = time.monotonic()
    head, *rest = h.enqueue("a", [{"do": "hang"}, {}, {}])
    wait_until(
        lambda: h.row(head)["status"] in ("timeout", "failed", "done"),
        30,
        message=lambda: f"hung row leaves running: {h.row(head)}",
    )
    took = time.monotonic() - t0
    row = h.row(head)
    assert row["status"] == "timeout", row
    assert took < 10, f"MAX_RUNTIME 1 s but the timeout took {took:.1f} s"
    h.wait_all(timeout=30)
    assert [h.row(i)["status"] for i in rest] == ["done"] * 2
    log = h.wlog()
    (hung_pid,) = {r.pid for r in log.runs_of(head)}
    wait_until(lambda: not pid_alive(hung_pid), 10, message="hung worker killed")
    assert h.overlaps() == []
    wait_until(
        lambda: h.stage_stats().get("a", {}).get("timeouts") == 1,
        10,
        message=lambda: f"timeout counted: {h.stage_stats()}",
    )
    assert d.terminate() == 0


def test_garbage_line_fails_message_and_replaces_worker(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=4)))
    # the second message is slow, so the garbage worker is likely busy with it when stopped
    head, *rest = h.enqueue("a", [{"do": "garbage"}, {"do": "sleep:0.5;next"}, {}, {}])
    h.wait_all(timeout=30)
    row = h.row(head)
    assert row["status"] == "failed", row
    assert "this is not an answer" in error_of(row), error_of(row)
    assert [h.row(i)["status"] for i in rest] == ["done"] * 3
    log = h.wlog()
    (bad_pid,) = {r.pid for r in log.runs_of(head)}
    wait_until(lambda: not pid_alive(bad_pid), 10, message="garbage worker stopped")
    assert len(log.spawns) >= 2, "the worker was not replaced"
    assert any(r.pid != bad_pid for i in rest for r in log.runs_of(i))
    # an id the stopped worker had started must not run again while it was still running
    assert h.overlaps() == []
    assert d.running()
    assert d.terminate() == 0


def test_leave_running_is_failed(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=2)))
    bad, good = h.enqueue("a", [{"do": "leave_running"}, {}])
    h.wait_all(timeout=30)
    row = h.row(bad)
    assert row["status"] == "failed", row
    assert re.search(r"running", error_of(row)), error_of(row)
    assert row["dispatcher_id"] is None
    assert h.row(good)["status"] == "done"
    assert d.terminate() == 0  # flushes the statistics
    # counted as what it became: a failure, not a message processed
    assert h.stage_stats()["a"]["processed"] == 1, h.stage_stats()
    assert h.stage_stats()["a"]["failed"] == 1, h.stage_stats()
    assert h.dispatch_stats()["failed"] == 1, h.dispatch_stats()


def test_nonzero_answer_fails_only_that_message(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=3)))
    bad, *good = h.enqueue("a", [{"do": "fail"}, {}, {}])
    h.wait_all(timeout=30)
    row = h.row(bad)
    assert row["status"] == "failed"
    assert error_of(row) == "3 scripted failure", row["state"]
    assert [h.row(i)["status"] for i in good] == ["done", "done"]
    log = h.wlog()
    assert len(log.spawns) == 1, "the worker must live on after a non-zero answer"
    assert d.terminate() == 0


def test_missing_program_cools_down_then_recovers(h: Harness) -> None:
    # serve refuses to start when a PROGRAM of its file cannot run (exit 2); one
    # that goes missing later (here: through the database overlay) holds the
    # stage off until it is fixed.
    conf = h.conf({"a": {"PROGRAM": h.program()}})
    h.set_config("stage-a", "PROGRAM", str(h.tmp / "no-such-program"))
    d = h.start(conf)
    ids = h.enqueue("a", 3)
    wait_until(
        lambda: re.search(r"cool", d.log(), re.I),
        20,
        message=lambda: "a cooldown in the log:\n" + d.tail(),
    )
    # rows stay pending (never failed), the dispatcher keeps running
    t_end = time.monotonic() + 3
    while time.monotonic() < t_end:
        statuses = {h.row(i)["status"] for i in ids}
        assert statuses <= {"pending", "running"}, statuses
        assert d.running(), d.tail()
        time.sleep(0.2)
    wait_until(
        lambda: {h.row(i)["status"] for i in ids} == {"pending"},
        10,
        message="rows back to pending between attempts",
    )
    # fix it through the database overlay: the rows get processed
    h.set_config("stage-a", "PROGRAM", h.program())
    h.wait_all("done", timeout=60)
    assert d.terminate() == 0


def test_paused_row_retried_at_due_time_not_heartbeat(h: Harness) -> None:
    # POLL_INTERVAL 60 s: only the earliest-due timer can bring the row back in time
    d = h.start(h.conf(h.pipeline(["a"]), POLL_INTERVAL="60 s"))
    (i,) = h.enqueue("a", [{"do": "pause_once:2"}])
    wait_until(lambda: h.row(i)["status"] == "paused", 20, message="row paused")
    due = h.row(i)["timeout"]
    h.wait_all("done", timeout=30)
    row = h.row(i)
    assert row["retries"] == 1, row
    late = (row["updated_at"] - due).total_seconds()
    assert 0 <= late <= 1.5, f"retried {late:.2f} s after its due time"
    assert d.terminate() == 0


def test_retry_cap(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a"], MAX_RETRIES=2)))
    (i,) = h.enqueue("a", [{"do": "pause:0.3"}])
    wait_until(
        lambda: h.row(i)["status"] in ("failed", "expired", "done"),
        30,
        message=lambda: f"retries exhausted: {h.row(i)}",
    )
    row = h.row(i)
    assert row["status"] == "failed", row
    assert row["retries"] == 2, row
    assert "retries exhausted" in str(row["state"]), row["state"]
    starts = [r for r in h.wlog().runs if r.wq_id == i]
    assert len(starts) == 3  # first run + 2 retries
    wait_until(
        lambda: h.dispatch_stats()["requeued"] == 2,
        10,
        message=lambda: f"2 requeues counted: {h.dispatch_stats()}",
    )
    # The row requeue_due failed with 'retries exhausted' counts as failed, in
    # its stage and in the global total.
    wait_until(
        lambda: h.stage_stats().get("a", {}).get("failed") == 1,
        10,
        message=lambda: f"exhausted row counted in stage_stats: {h.stage_stats()}",
    )
    assert h.dispatch_stats()["failed"] == 1, h.dispatch_stats()
    assert d.terminate() == 0


def test_expiry(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a"], MAX_RETRIES=1000), EXPIRY="2 s"))
    (i,) = h.enqueue("a", [{"do": "pause:0.3"}])
    wait_until(
        lambda: h.row(i)["status"] not in ("pending", "running", "paused"),
        30,
        message=lambda: f"row expired: {h.row(i)}",
    )
    row = h.row(i)
    assert row["status"] == "expired", row
    assert row["retries"] >= 1
    wait_until(
        lambda: h.dispatch_stats()["expired"] == 1,
        10,
        message=lambda: f"expiry counted: {h.dispatch_stats()}",
    )
    assert d.terminate() == 0


def test_max_runtime_is_timed_from_the_head_of_line(h: Harness) -> None:
    # three 0.7 s messages pipelined on one worker take 2.1 s together, but each one is
    # at the head for only 0.7 s < MAX_RUNTIME 1.5 s: none times out
    d = h.start(h.conf(h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=3), MAX_RUNTIME="1500 ms"))
    ids = h.enqueue("a", [{"do": "sleep:0.7;next"} for _ in range(3)])
    h.wait_all(timeout=30)
    assert [h.row(i)["status"] for i in ids] == ["done"] * 3
    log = h.wlog()
    assert len({r.pid for r in log.runs}) == 1  # really pipelined on one worker
    assert d.terminate() == 0


def test_crash_loop_is_held_off(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a"], PARALLELISM=2, QUEUE_LIMIT=1)))
    h.enqueue("a", [{"do": "exit:1"} for _ in range(30)])
    t0 = time.monotonic()
    wait_until(lambda: time.monotonic() - t0 > 4, 10)
    spawns = len(h.wlog().spawns)
    failed = h.counts().get("failed", 0)
    assert d.running(), d.tail()
    assert spawns <= 12, f"{spawns} workers started in 4 s by a stage that crashes in a loop"
    assert failed >= 1
    assert re.search(r"cool|hold", d.log(), re.I), d.tail()
    # the stage is held off, not given up: rows are failed one crash at a time, the rest
    # stay pending (never lost, never left running)
    counts = h.counts()
    assert set(counts) <= {"pending", "failed", "running"}, counts
    assert d.terminate() == 0
    assert set(h.counts()) <= {"pending", "failed"}, h.counts()


def test_clean_exit_with_work_in_hand_is_a_crash(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=3)))
    head, *rest = h.enqueue("a", [{"do": "exit:0"}, {}, {}])
    h.wait_all(timeout=30)
    row = h.row(head)
    assert row["status"] == "failed", row
    assert re.search(r"\b0\b", error_of(row)), error_of(row)
    assert [h.row(i)["status"] for i in rest] == ["done", "done"]
    assert h.overlaps() == []
    assert d.terminate() == 0


def test_answer_in_pieces_and_long_stderr_line(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=4)))
    ids = h.enqueue(
        "a",
        [
            {"do": "split_answer;next"},
            {"do": "stderr_noline:3000000;next"},
            {"do": "split_answer;fail"},
            {},
        ],
    )
    h.wait_all(timeout=30)
    assert [h.row(i)["status"] for i in ids] == ["done", "done", "failed", "done"]
    assert error_of(h.row(ids[2])) == "3 scripted failure"
    assert len(h.wlog().spawns) == 1, "a split answer is not a protocol error"
    assert d.running()
    assert d.terminate() == 0


def test_rows_of_unknown_stage_stay_pending(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a"])))
    stray = h.enqueue("nosuchstage", 3)
    ok = h.enqueue("a", 3)
    h.wait_all("done", timeout=30, where=f"workqueue_id >= {ok[0]}")
    assert {h.row(i)["status"] for i in stray} == {"pending"}
    assert d.running()
    assert d.terminate() == 0


def test_earlier_pause_rearms_the_retry_timer(h: Harness) -> None:
    # A is due in 5 s; B, paused later, is due in 1 s: B must not wait for A's due time
    d = h.start(h.conf(h.pipeline(["a"]), POLL_INTERVAL="60 s"))
    (a,) = h.enqueue("a", [{"do": "pause_once:5"}])
    wait_until(lambda: h.row(a)["status"] == "paused", 20, message="A paused")
    (b,) = h.enqueue("a", [{"do": "pause_once:1"}])
    wait_until(lambda: h.row(b)["status"] == "paused", 20, message="B paused")
    due_b = h.row(b)["timeout"]
    due_a = h.row(a)["timeout"]
    assert due_b < due_a
    wait_until(lambda: h.row(b)["status"] == "done", 10, message=lambda: f"B done: {h.row(b)}")
    done_b = h.row(b)["updated_at"]
    # The bug this guards against: B's retry waited for A's timer. B is done
    # before A is even due. (The slack beyond the due time covers a loaded
    # box: the retry still runs a worker; POLL_INTERVAL is 60 s.)
    assert done_b < due_a, f"B done at {done_b}, after A's due time {due_a}"
    late = (done_b - due_b).total_seconds()
    assert late <= 3, f"B retried {late:.2f} s after its due time"
    assert h.row(a)["status"] == "paused"
    wait_until(lambda: h.row(a)["status"] == "done", 15, message=lambda: f"A done: {h.row(a)}")
    late = (h.row(a)["updated_at"] - due_a).total_seconds()
    assert 0 <= late <= 3, f"A retried {late:.2f} s after its due time"
    assert d.terminate() == 0


def test_crash_detected_while_a_grandchild_holds_the_pipes(h: Harness) -> None:
    # the worker dies, but a process it forked keeps its stdout/stderr open for 30 s:
    # the crash must be seen from the exit, not from EOF on the pipes
    d = h.start(h.conf(h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=3)))
    t0 = time.monotonic()
    head, *rest = h.enqueue("a", [{"do": "fork_exit:3"}, {}, {}])
    try:
        h.wait_all(timeout=20)
        took = time.monotonic() - t0
        row = h.row(head)
        assert row["status"] == "failed", row
        assert re.search(r"\b3\b", error_of(row)), error_of(row)
        assert [h.row(i)["status"] for i in rest] == ["done", "done"]
        assert took < 10, f"crash noticed only after {took:.1f} s"
        assert d.running()
        assert d.terminate() == 0
    finally:
        for line in h.worker_log.read_text().splitlines():
            if line.startswith("GRANDCHILD "):
                gc = int(line.split()[2])
                if pid_alive(gc) and "scripted_worker" in " ".join(proc_cmdline(gc)):
                    os.kill(gc, 9)


def test_hang_behind_the_head_times_out_after_reaching_it(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=3), MAX_RUNTIME="1 s"))
    first, hung, last = h.enqueue("a", [{"do": "sleep:0.8;next"}, {"do": "hang"}, {}])
    h.wait_all(timeout=30)
    assert [h.row(i)["status"] for i in (first, hung, last)] == ["done", "timeout", "done"]
    log = h.wlog()
    (hung_run,) = log.runs_of(hung)
    (last_run,) = log.runs_of(last)
    assert last_run.pid != hung_run.pid  # requeued to a new worker, not run by the hung one
    assert h.overlaps() == []
    assert d.terminate() == 0


def test_slow_worker_start_does_not_count_against_max_runtime(h: Harness) -> None:
    # the worker takes 2 s before it reads stdin; MAX_RUNTIME 1 s runs from the read
    stages = h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=2)
    stages["a"]["PROGRAM"] += " --startup-delay 2"
    d = h.start(h.conf(stages, MAX_RUNTIME="1 s"))
    ids = h.enqueue("a", [{"do": "sleep:0.3;next"}, {"do": "sleep:0.3;next"}])
    h.wait_all(timeout=30)
    assert [h.row(i)["status"] for i in ids] == ["done", "done"]
    assert d.terminate() == 0


def test_program_exiting_before_reading_fails_nothing(h: Harness) -> None:
    # /bin/false starts (exec works) but exits before reading any id: none of its ids
    # was started, so none may fail (lead's F6 decision); the stage is held off instead
    d = h.start(h.conf({"a": {"PROGRAM": "/bin/false"}}))
    ids = h.enqueue("a", 5)
    t_end = time.monotonic() + 4
    while time.monotonic() < t_end:
        statuses = {h.row(i)["status"] for i in ids}
        assert statuses <= {"pending", "running"}, [h.row(i) for i in ids]
        assert d.running(), d.tail()
        time.sleep(0.1)
    assert re.search(r"cool|hold", d.log(), re.I), d.tail()
    h.set_config("stage-a", "PROGRAM", h.program())
    h.wait_all("done", timeout=60)
    assert d.terminate() == 0
