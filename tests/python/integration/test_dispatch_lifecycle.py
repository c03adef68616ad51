"""The real dispatcher's life: SIGTERM, kill -9 (repeated) and restart, a second
dispatcher, hot reload under load and a bad reloaded graph.
"""

from __future__ import annotations

import os
import signal
import socket
import time

from dispatch_harness import (  # noqa: F401
    Harness,
    harness_fixture,
    pid_alive,
    wait_until,
)


def running_rows(h: Harness) -> int:
    return h.conn.execute(
        "SELECT count(*) FROM pepsi.messages WHERE status = 'running'"
    ).fetchone()[0]


def test_sigterm_with_work_in_flight(h: Harness) -> None:
    conf = h.conf(h.pipeline(["a", "b"], PARALLELISM=2, QUEUE_LIMIT=3))
    d = h.start(conf)
    n = 60
    h.enqueue("a", [{"do": "sleep:0.2;next"} for _ in range(n)])
    wait_until(lambda: running_rows(h) >= 4, 20, message="work in flight")
    # rows turn running when the claim commits, a moment before their workers exist
    workers = wait_until(
        lambda: [p for pids in d.workers().values() for p in pids], 10, message="workers"
    )
    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    rc = d.wait_exit(20)
    took = time.monotonic() - t0
    assert rc == 0, d.tail()
    assert took < 5 + 5, f"shutdown took {took:.1f} s (SHUTDOWN_TIMEOUT 5 s)"
    assert running_rows(h) == 0, h.counts()
    counts = h.counts()
    assert set(counts) <= {"pending", "done"}, counts
    assert counts.get("done", 0) < n  # it really was stopped mid-run
    for pid in workers:
        wait_until(lambda pid=pid: not pid_alive(pid), 5, message=f"worker {pid} gone")
    # SIGTERM let every worker finish the message in hand: no run was cut off
    cut = [r for r in h.wlog().runs if r.end is None]
    assert not cut, f"messages cut off by the shutdown: {cut[:5]}"
    # stats were flushed at shutdown
    assert h.dispatch_stats()["messages"] > 0
    # a restart finishes the rest, and nothing ran twice at once
    d2 = h.start(conf)
    h.wait_all("done", timeout=60)
    assert h.overlaps() == []
    assert d2.terminate() == 0


def test_sigterm_kills_hung_worker_after_shutdown_timeout(h: Harness) -> None:
    conf = h.conf(h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=2), SHUTDOWN_TIMEOUT="1 s")
    d = h.start(conf)
    hung, queued = h.enqueue("a", [{"do": "hang"}, {}])
    wait_until(lambda: h.wlog().runs_of(hung), 20, message="the hang started")
    (pid,) = {r.pid for r in h.wlog().runs_of(hung)}
    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    assert d.wait_exit(20) == 0, d.tail()
    took = time.monotonic() - t0
    assert took < 1 + 4, f"shutdown took {took:.1f} s with SHUTDOWN_TIMEOUT 1 s"
    wait_until(lambda: not pid_alive(pid), 5, message="hung worker killed")
    # the hung message was not failed: it goes back to pending like the queued one
    assert h.row(hung)["status"] == "pending", h.row(hung)
    assert h.row(queued)["status"] == "pending", h.row(queued)
    assert running_rows(h) == 0


def test_kill9_repeated_then_restart_finishes_everything(h: Harness) -> None:
    stages = h.pipeline(["a", "b", "c"], PARALLELISM=2, QUEUE_LIMIT=3)
    conf = h.conf(stages)
    n = 240
    ids = h.enqueue("a", [{"do": "sleep:0.02;next"} for _ in range(n)])
    kills = 3
    for round_ in range(kills):
        d = h.start(conf)
        did = d.dispatcher_id(h.conn)
        before = h.counts().get("done", 0)
        # in the middle of the run: rows in flight, some done since this start
        wait_until(
            lambda before=before: h.counts().get("done", 0) >= before + 15 and running_rows(h) >= 3,
            30,
            message=lambda r=round_: f"progress in round {r}: {h.counts()}",
        )
        d.workers()
        assert d.seen_workers
        d.kill9()

        def survivors(did=did, d=d):
            # every worker this dispatcher ever started, including any spawned just
            # before the kill (their SPAWN lines may land a moment later)
            spawned = {pid for pid, sp in h.wlog().spawns.items() if sp[1] == str(did)}
            return [p for p in spawned | d.seen_workers if pid_alive(p)]

        # the workers must die on their own (the kernel ends them with their dispatcher)
        wait_until(
            lambda survivors=survivors: not survivors(),
            5,
            message=lambda survivors=survivors: (
                f"workers of the killed dispatcher still alive: {survivors()}"
            ),
        )
        time.sleep(0.3)
        assert not survivors(), "a worker of the killed dispatcher appeared after its death"
    assert h.counts().get("done", 0) < n, "the run finished before the last kill"
    d = h.start(conf)
    h.wait_all(timeout=120)
    assert h.counts() == {"done": n}
    rows = h.conn.execute(
        "SELECT count(*) FROM pepsi.messages WHERE workqueue_id = ANY(%s) AND stage = 'c'",
        (ids,),
    ).fetchone()[0]
    assert rows == n
    overlaps = h.overlaps()
    assert overlaps == [], f"ids in two workers at once: {overlaps[:5]}"
    # every stage of every message ran (a run may lack its END: a worker killed between
    # its commit and its log line)
    log = h.wlog()
    for s in ("a", "b", "c"):
        ran = {r.wq_id for r in log.runs if r.stage == s}
        assert ran == set(ids), f"stage {s}: {len(set(ids) - ran)} ids never ran"
    assert d.terminate() == 0


def test_second_dispatcher_refused(h: Harness) -> None:
    conf = h.conf(h.pipeline(["a"]))
    d1 = h.start(conf)
    d2 = h.start(conf, wait=False)
    rc = d2.wait_exit(30)
    out = d2.log()
    assert rc == 2, out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    error_lines = [ln for ln in lines if "error" in ln.lower()]
    assert len(error_lines) == 1, out
    line = error_lines[0]
    holder = (str(d1.pid), socket.gethostname())
    assert any(x in line for x in holder), f"the refusal does not name the holder: {line!r}"
    # the first one serves on, unharmed
    assert d1.running()
    h.enqueue("a", 3)
    h.wait_all("done", timeout=30)
    assert d1.terminate() == 0


def test_reload_under_load_fails_nothing(h: Harness) -> None:
    stages = h.pipeline(["a", "b"], PARALLELISM=3, QUEUE_LIMIT=2)
    d = h.start(h.conf(stages))
    n = 300
    h.enqueue("a", [{"do": "sleep:0.01;next"} for _ in range(n)])
    changes = [
        ("stage-a", "PARALLELISM", "1"),
        ("stage-b", "QUEUE_LIMIT", "4"),
        ("stage-b", "PROGRAM", h.program({"a": "b"}) + " --next x=y"),
        ("stage-a", "QUEUE_LIMIT", "1"),
    ]
    for section, option, value in changes:
        wait_until(lambda: running_rows(h) > 0 or h.counts().get("done") == n, 20)
        h.set_config(section, option, value)
        time.sleep(0.3)
    # the new PARALLELISM of stage a took effect: at most one worker there from now on
    wait_until(lambda: len(d.workers().get("a", [])) <= 1, 15, message="stage a shrunk to 1")
    over = []
    end = time.monotonic() + 1.5
    while time.monotonic() < end and h.counts().get("done", 0) < n:
        if len(d.workers().get("a", [])) > 1:
            over.append(d.workers())
        time.sleep(0.02)
    assert not over, over[:3]
    counts = h.wait_all(timeout=120)
    assert counts == {"done": n}, counts
    assert h.overlaps() == []
    assert d.running()
    assert "reload" in d.log().lower()
    # stage b's workers were retired and replaced by ones running the new PROGRAM
    new_b = [sp for sp in h.wlog().spawns.values() if sp[0] == "b" and "x=y" in sp]
    assert new_b, "no stage-b worker started with the reloaded PROGRAM"
    assert d.terminate() == 0


def test_bad_reloaded_graph_ends_process(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a", "b"])))
    h.enqueue("a", [{"do": "sleep:0.2;next"} for _ in range(6)])
    wait_until(lambda: running_rows(h) > 0, 20, message="work in flight")
    h.set_config("stage-a", "NEXT", "nosuchstage")
    rc = d.wait_exit(30)
    assert rc == 1, d.tail()
    assert "nosuchstage" in d.log(), d.tail()
    assert running_rows(h) == 0, "rows left running after the fatal reload"


def test_orphans_of_a_previous_dispatcher_are_reset(h: Harness) -> None:
    (i,) = h.enqueue("a", 1)
    # a running row held by a dispatcher that is gone
    h.conn.execute(
        "UPDATE pepsi.workqueue SET status = 'running', dispatcher_id = 424242"
        " WHERE workqueue_id = %s",
        (i,),
    )
    d = h.start(h.conf(h.pipeline(["a"])))
    h.wait_all("done", timeout=30)
    assert d.terminate() == 0


def test_sigint_also_shuts_down_cleanly(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a"])))
    h.enqueue("a", [{"do": "sleep:0.3;next"} for _ in range(8)])
    wait_until(lambda: running_rows(h) > 0, 20)
    os.kill(d.pid, signal.SIGINT)
    assert d.wait_exit(20) == 0
    assert running_rows(h) == 0


def test_mixed_modes_refuse_each_other(h: Harness) -> None:
    """A single-mode dispatcher owns the database alone (it resets every running row at
    start and claims without skipping locks): it must not run beside competing replicas,
    in either order."""
    single = h.conf(h.pipeline(["a"]), name="single.conf")
    competing = h.conf(h.pipeline(["a"]), name="competing.conf", COMPETING="YES")
    d1 = h.start(competing)
    h.enqueue("a", [{"do": "sleep:1;next"} for _ in range(4)])
    wait_until(lambda: running_rows(h) > 0, 20)
    d2 = h.start(single, wait=False)
    assert d2.wait_exit(30) == 2, d2.log()
    assert running_rows(h) > 0, "the refused single dispatcher reset the replica's rows"
    assert d1.terminate() == 0
    d3 = h.start(single)
    d4 = h.start(competing, wait=False)
    assert d4.wait_exit(30) == 2, d4.log()
    h.wait_all("done", timeout=30)
    assert d3.terminate() == 0
