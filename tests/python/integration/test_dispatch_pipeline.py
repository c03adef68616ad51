"""The real dispatcher driving real workers: pipelines, capacity bounds, pools, stats.

Every test runs `pepsi-dispatch serve` as a subprocess against its own fresh database.
POLL_INTERVAL is 60 s in these configurations, so everything that completes within the
deadlines was driven by notifications and worker answers, not by the heartbeat.
"""

from __future__ import annotations

import time

from dispatch_harness import Harness, harness_fixture, wait_until  # noqa: F401


def test_shell_worker_drives_two_stage_pipeline(h: Harness) -> None:
    prog = h.shell_program({"a": "b"})
    conf = h.conf({"a": {"PROGRAM": prog, "NEXT": "b"}, "b": {"PROGRAM": prog}})
    d = h.start(conf)
    ids = h.enqueue("a", 25)
    counts = h.wait_all("done", timeout=60)
    assert counts == {"done": 25}
    rows = h.conn.execute(
        "SELECT DISTINCT stage FROM pepsi.messages WHERE workqueue_id = ANY(%s)", (ids,)
    ).fetchall()
    assert rows == [("b",)]
    assert d.running()
    assert d.terminate() == 0


def test_capacity_bounds_sampled_under_load(h: Harness) -> None:
    limits = {"a": (3, 2), "b": (2, 3)}  # stage: (PARALLELISM, QUEUE_LIMIT)
    stages = h.pipeline(["a", "b"])
    for s, (p, q) in limits.items():
        stages[s].update(PARALLELISM=p, QUEUE_LIMIT=q)
    d = h.start(h.conf(stages))
    n = 150
    h.enqueue("a", [{"do": "sleep:0.03;next"} for _ in range(n)])

    max_workers = {s: 0 for s in limits}
    max_running = {s: 0 for s in limits}
    violations = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        workers = d.workers()
        running = dict(
            h.conn.execute(
                "SELECT stage, count(*) FROM pepsi.messages WHERE status = 'running' GROUP BY stage"
            ).fetchall()
        )
        for s, (p, q) in limits.items():
            nw, nr = len(workers.get(s, [])), running.get(s, 0)
            max_workers[s] = max(max_workers[s], nw)
            max_running[s] = max(max_running[s], nr)
            if nw > p or nr > p * q:
                violations.append((s, nw, nr))
        if h.counts().get("done", 0) == n:
            break
        time.sleep(0.02)
    assert h.counts() == {"done": n}
    assert not violations, f"capacity exceeded (stage, workers, running rows): {violations[:10]}"
    # it really was loaded: stage a reached its worker cap and filled its pipelines
    assert max_workers["a"] == 3, max_workers
    assert max_running["a"] > 3, max_running

    log = h.wlog()
    stage_of = {pid: spawn[0] for pid, spawn in log.spawns.items()}
    too_deep = {pid: qmax for pid, qmax in log.queue_max.items() if qmax > limits[stage_of[pid]][1]}
    assert not too_deep, f"more than QUEUE_LIMIT unanswered ids on a worker: {too_deep}"
    # pipelining happened at all (a queue deeper than one was seen on stage a)
    assert max(q for pid, q in log.queue_max.items() if stage_of[pid] == "a") > 1
    per_stage_workers = {s: {pid for pid, st in stage_of.items() if st == s} for s in limits}
    assert all(per_stage_workers[s] for s in limits)
    # no id in two workers at once, and each id ran exactly once per stage
    assert h.overlaps() == []
    for s in limits:
        assert sorted(r.wq_id for r in log.runs if r.stage == s) == list(
            range(min(r.wq_id for r in log.runs), min(r.wq_id for r in log.runs) + n)
        )
    assert d.terminate() == 0


def test_packing_idle_reap_and_recycle(h: Harness) -> None:
    stages = h.pipeline(["a"], PARALLELISM=4, QUEUE_LIMIT=4, MAX_MESSAGES=5)
    d = h.start(h.conf(stages, WORKER_IDLE_TIMEOUT="1 s"))
    # three messages fit one worker's pipeline: they are packed onto one worker
    ids = h.enqueue("a", [{"do": "sleep:0.2;next"} for _ in range(3)])
    h.wait_all("done", timeout=30)
    log = h.wlog()
    assert len({r.pid for r in log.runs if r.wq_id in ids}) == 1, log.runs
    # ... written to its stdin in one write: the worker read all three in one read()
    recv = {r.start for r in log.holds if r.wq_id in ids}
    assert len(recv) == 1, f"the ids reached the worker in {len(recv)} reads"
    # idle workers stop after WORKER_IDLE_TIMEOUT
    wait_until(lambda: not d.workers().get("a"), 15, message="idle workers reaped")
    assert d.running()
    # reaped by closing their stdin (EOF: finish and exit 0)
    first = next(iter(h.wlog().spawns))
    assert h.wlog().exits.get(first) == "eof", h.wlog().exits
    # MAX_MESSAGES = 5: a worker is replaced after 5 messages
    more = h.enqueue("a", [{"do": "sleep:0.01;next"} for _ in range(4)])
    h.wait_all("done", timeout=30)
    more += h.enqueue("a", [{"do": "sleep:0.01;next"} for _ in range(9)])
    h.wait_all("done", timeout=30)
    log = h.wlog()
    per_pid: dict[int, int] = {}
    for r in log.runs:
        per_pid[r.pid] = per_pid.get(r.pid, 0) + 1
    assert max(per_pid.values()) <= 5, per_pid
    assert sum(per_pid.values()) == 16
    # a program that is not the SDK's ignores the template offered to its
    # workers (its template probe's first): they are exec'd each time, and no
    # template process is ever said to be started or forked
    assert "template process" not in d.log() and "forked by" not in d.log(), d.log()
    assert d.terminate() == 0


def test_stderr_flood_does_not_block(h: Harness) -> None:
    stages = h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=2)
    d = h.start(h.conf(stages))
    megabytes = 8
    t0 = time.monotonic()
    ids = h.enqueue("a", [{"do": f"stderr_flood:{megabytes * 1_000_000};next"}, {}, {}])
    h.wait_all("done", timeout=60)
    elapsed = time.monotonic() - t0
    assert [h.row(i)["status"] for i in ids] == ["done"] * 3
    assert elapsed < 20, f"{megabytes} MB of stderr took {elapsed:.1f} s to get through"
    text = d.log()
    assert "x" * 99 in text, "worker stderr was not relayed to the dispatcher log"
    assert d.running()
    assert d.terminate() == 0
    print(f"stderr flood: {megabytes} MB relayed, 3 messages done in {elapsed:.2f} s")


def test_statistics_match_processed_counts(h: Harness) -> None:
    stages = h.pipeline(["a", "b"], PARALLELISM=2, QUEUE_LIMIT=3)
    d = h.start(h.conf(stages))  # STATS_INTERVAL 60 s: only the idle flush can write
    n_plain, n_fused, n_failed = 30, 12, 5
    h.enqueue(
        "a",
        [{} for _ in range(n_plain)]
        + [{"do_a": "fuse:b"} for _ in range(n_fused)]
        + [{"do": "fail"} for _ in range(n_failed)],
    )
    h.wait_all(timeout=60)
    counts = h.counts()
    assert counts == {"done": n_plain + n_fused, "failed": n_failed}

    expected_messages = 2 * n_plain + n_fused + n_failed
    expected_runs = {2 * n_plain + 2 * n_fused, 2 * n_plain + 2 * n_fused + n_failed}

    def flushed():
        ds = h.dispatch_stats()
        return ds.get("messages") == expected_messages and ds

    ds = wait_until(flushed, 10, 0.1, lambda: f"idle stats flush: {h.dispatch_stats()}")
    assert ds["stage_runs"] in expected_runs, ds
    assert ds["failed"] == n_failed
    assert ds["crashes"] == 0 and ds["timeouts"] == 0
    ss = h.stage_stats()
    assert ss["a"]["processed"] == n_plain + n_fused, ss
    assert ss["b"]["processed"] == n_plain + n_fused, ss
    assert ss["a"]["failed"] == n_failed and ss["b"]["failed"] == 0, ss
    assert ss["a"]["processing_seconds"] > 0
    # nothing is written while there are no deltas
    before = (h.dispatch_stats()["updated_at"], {s: v["updated_at"] for s, v in ss.items()})
    time.sleep(2.5)
    after = (
        h.dispatch_stats()["updated_at"],
        {s: v["updated_at"] for s, v in h.stage_stats().items()},
    )
    assert before == after, "stats rewritten without deltas"
    assert d.terminate() == 0
    # shutdown flush adds nothing new either
    assert h.dispatch_stats()["messages"] == expected_messages


def test_info_log_is_quiet_under_load(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a", "b"], PARALLELISM=2)))
    n = 600
    h.enqueue("a", n)
    h.wait_all("done", timeout=60)
    assert d.terminate() == 0
    lines = d.log().splitlines()
    # one line per event worth an operator's attention (start, spawn, stop), none per message
    assert len(lines) < 30, "\n".join(lines[:40])
    text = d.log().lower()
    assert "start" in text and "stop" in text


def test_overlay_adds_a_stage_and_odd_stage_names(h: Harness) -> None:
    odd = "img.resize-2_x"
    stages = h.pipeline(["a", odd])
    d = h.start(h.conf(stages))
    ids = h.enqueue("a", 5)
    h.wait_all("done", timeout=30)
    assert {h.row(i)["stage"] for i in ids} == {odd}
    # a stage only the database overlay defines; rows waiting for it are picked up by
    # the reload itself (no workqueue notification comes after it, POLL_INTERVAL is 60 s)
    early = h.enqueue("zeta", 3)
    h.set_config("stage-zeta", "PROGRAM", h.program())
    h.set_config("stage-zeta", "PARALLELISM", "1")
    wait_until(lambda: "reload" in d.log().lower(), 10, message="reload logged")
    h.wait_all("done", timeout=15, where=f"workqueue_id >= {early[0]}")
    z = h.enqueue("zeta", 4)
    h.wait_all("done", timeout=30, where=f"workqueue_id >= {z[0]}")
    assert d.running()
    assert d.terminate() == 0


def test_trickle_is_packed_onto_one_worker(h: Harness) -> None:
    # a trickle: each message arrives once the one before it is done, so at most one
    # is in flight and the worker that exists always has room (QUEUE_LIMIT 4): one
    # worker is enough. (Arrivals on a fixed clock made this depend on the machine's
    # load: a worker that fell four messages behind rightly got a second worker.)
    d = h.start(h.conf(h.pipeline(["a"], PARALLELISM=4, QUEUE_LIMIT=4), WORKER_IDLE_TIMEOUT="10 s"))
    for i in range(20):
        h.enqueue("a", [{"do": "sleep:0.1;next"}])
        wait_until(lambda i=i: h.counts().get("done", 0) == i + 1, 30)
    log = h.wlog()
    assert len(log.spawns) == 1, f"{len(log.spawns)} workers for a trickle one worker can carry"
    assert d.terminate() == 0


def test_stats_flushed_every_stats_interval_under_load(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=2), STATS_INTERVAL="1 s"))
    n = 150
    h.enqueue("a", [{"do": "sleep:0.03;next"} for _ in range(n)])  # ~5 s of steady work
    # while the backlog lasts (never idle), the deltas still reach the table
    seen = wait_until(
        lambda: (m := h.dispatch_stats()["messages"]) > 0 and h.counts().get("pending") and m,
        10,
        message=lambda: f"a stats flush before the backlog is gone: {h.dispatch_stats()}",
    )
    assert 0 < seen < n
    h.wait_all("done", timeout=60)
    wait_until(lambda: h.dispatch_stats()["messages"] == n, 10)
    assert d.terminate() == 0


def test_max_messages_recycle_starts_a_warm_spare(h: Harness) -> None:
    """A worker nearing MAX_MESSAGES gets its replacement started early (a warm
    spare, handed nothing), which takes over its slot once it has drained: the
    spare is started before the old worker stops, and at no moment do more than
    PARALLELISM workers hold unanswered ids."""
    p, limit = 2, 20
    stages = h.pipeline(["a"], PARALLELISM=p, QUEUE_LIMIT=4, MAX_MESSAGES=limit)
    d = h.start(h.conf(stages, WORKER_IDLE_TIMEOUT="30 s"))
    n = 120
    h.enqueue("a", [{"do": "sleep:0.01;next"} for _ in range(n)])
    h.wait_all("done", timeout=60)
    log = h.wlog()
    per_pid: dict[int, int] = {}
    for r in log.runs:
        per_pid[r.pid] = per_pid.get(r.pid, 0) + 1
    assert sum(per_pid.values()) == n
    assert max(per_pid.values()) <= limit, per_pid
    # processing workers (holding a read, unanswered id) never exceed PARALLELISM
    events = sorted(
        [(r.start, 1, r.pid) for r in log.holds] + [(r.end or 0, -1, r.pid) for r in log.holds],
        key=lambda e: (e[0], e[1]),
    )
    open_ids: dict[int, int] = {}
    most = 0
    for _, delta, pid in events:
        open_ids[pid] = open_ids.get(pid, 0) + delta
        most = max(most, sum(1 for v in open_ids.values() if v > 0))
    assert most <= p, f"{most} workers held unanswered ids at once"
    # the replacement was started before the worker it replaces drained and stopped
    text = d.log()
    lines = text.splitlines()
    spare_at = [i for i, line in enumerate(lines) if "as a warm spare" in line]
    stop_at = [i for i, line in enumerate(lines) if f"stopped (MAX_MESSAGES ({limit})" in line]
    assert stop_at, text
    assert spare_at and spare_at[0] < stop_at[0], text
    assert len(spare_at) >= len(stop_at) - 1, text
    assert h.overlaps() == []
    assert d.terminate() == 0
