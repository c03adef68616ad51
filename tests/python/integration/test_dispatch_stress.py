"""The real dispatcher under awkward timing: reload storms, one message per worker,
idle reaps racing new work, paused rows across kill -9, a replica killed mid-pipeline.
"""

from __future__ import annotations

import random
import time
from collections import Counter

from dispatch_harness import Harness, harness_fixture, pid_alive, wait_until  # noqa: F401


def running_rows(h: Harness, dispatcher_id: int | None = None) -> int:
    sql = "SELECT count(*) FROM pepsi.messages WHERE status = 'running'"
    if dispatcher_id is not None:
        sql += f" AND dispatcher_id = {int(dispatcher_id)}"
    return h.conn.execute(sql).fetchone()[0]


def test_reload_storm_under_load(h: Harness) -> None:
    stages = h.pipeline(["a", "b", "c"], PARALLELISM=2, QUEUE_LIMIT=3)
    d = h.start(h.conf(stages))
    n = 400
    h.enqueue("a", [{"do": "sleep:0.005;next"} for _ in range(n)])
    rnd = random.Random(7)
    changes = 0
    while h.counts().get("done", 0) < n * 0.8 and changes < 40:
        stage = rnd.choice("abc")
        option, value = rnd.choice(
            [
                ("PARALLELISM", str(rnd.randint(1, 4))),
                ("QUEUE_LIMIT", str(rnd.randint(1, 5))),
                ("MAX_MESSAGES", str(rnd.randint(3, 50))),
            ]
        )
        h.set_config(f"stage-{stage}", option, value)
        changes += 1
        time.sleep(rnd.uniform(0.02, 0.15))
    assert changes >= 5
    counts = h.wait_all(timeout=120)
    assert counts == {"done": n}, counts
    assert d.running(), d.tail()
    assert h.overlaps() == []
    assert d.terminate() == 0


def test_one_message_per_worker(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a", "b"], PARALLELISM=3, QUEUE_LIMIT=4, MAX_MESSAGES=1)))
    n = 30
    h.enqueue("a", n)
    counts = h.wait_all(timeout=120)
    assert counts == {"done": n}, counts
    per_pid = Counter(r.pid for r in h.wlog().runs)
    assert max(per_pid.values()) == 1, per_pid.most_common(3)
    assert h.overlaps() == []
    assert d.terminate() == 0


def test_idle_reap_racing_new_work(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a"], PARALLELISM=2), WORKER_IDLE_TIMEOUT="300 ms"))
    rnd = random.Random(11)
    ids = []
    end = time.monotonic() + 6
    while time.monotonic() < end:
        ids += h.enqueue("a", rnd.randint(1, 2))
        time.sleep(rnd.uniform(0.2, 0.4))
    counts = h.wait_all(timeout=30)
    assert counts == {"done": len(ids)}, counts
    assert len(h.wlog().spawns) > 3, "workers were never reaped in between"
    assert h.overlaps() == []
    assert d.terminate() == 0


def test_paused_rows_survive_kill9(h: Harness) -> None:
    conf = h.conf(h.pipeline(["a"]))
    d = h.start(conf)
    ids = h.enqueue("a", [{"do": "pause_once:3"} for _ in range(10)])
    wait_until(lambda: h.counts() == {"paused": 10}, 20, message=lambda: str(h.counts()))
    d.kill9()
    d2 = h.start(conf)
    h.wait_all("done", timeout=30)
    assert {h.row(i)["retries"] for i in ids} == {1}
    assert d2.terminate() == 0


def test_competing_replica_killed_mid_pipeline(h: Harness) -> None:
    conf = h.conf(
        h.pipeline(["a", "b", "c"], PARALLELISM=2, QUEUE_LIMIT=2),
        COMPETING="YES",
        ORPHAN_TIMEOUT="2 s",
        POLL_INTERVAL="1 s",
    )
    n = 200
    ids = h.enqueue("a", [{"do": "sleep:0.01;next"} for _ in range(n)])
    d1 = h.start(conf)
    d2 = h.start(conf)
    id1 = d1.dispatcher_id(h.conn)
    wait_until(lambda: h.counts().get("done", 0) >= 30 and running_rows(h, id1) > 0, 60)
    d1.workers()
    mine = d1.seen_workers | {p for p, sp in h.wlog().spawns.items() if sp[1] == str(id1)}
    d1.kill9()
    wait_until(lambda: not [p for p in mine if pid_alive(p)], 5, message="workers die")
    d3 = h.start(conf)  # a fresh replica joins; it must not take d2's live rows
    counts = h.wait_all(timeout=120)
    assert counts == {"done": n}, counts
    assert h.overlaps() == []
    done_c = h.conn.execute(
        "SELECT count(*) FROM pepsi.messages WHERE stage = 'c' AND workqueue_id = ANY(%s)",
        (ids,),
    ).fetchone()[0]
    assert done_c == n
    assert d2.terminate() == 0 and d3.terminate() == 0


def test_kill9_storm(h: Harness) -> None:
    """kill -9 at random moments (right after start, mid-claim, mid-answer) many times."""
    conf = h.conf(h.pipeline(["a", "b", "c"], PARALLELISM=3, QUEUE_LIMIT=4))
    n = 1500
    h.enqueue("a", n)
    rnd = random.Random(5)
    for _ in range(8):
        d = h.start(conf)
        time.sleep(rnd.uniform(0.05, 0.8))
        d.workers()
        did = str(d.dispatcher_id(h.conn))
        d.kill9()

        def survivors(d=d, did=did):
            spawned = {p for p, sp in h.wlog().spawns.items() if sp[1] == did}
            return [p for p in spawned | d.seen_workers if pid_alive(p)]

        wait_until(lambda s=survivors: not s(), 5, message=lambda s=survivors: f"alive: {s()}")
    d = h.start(conf)
    counts = h.wait_all(timeout=120)
    assert counts == {"done": n}, counts
    assert h.overlaps() == []
    assert d.terminate() == 0


def test_competing_replicas_reload_together(h: Harness) -> None:
    conf = h.conf(
        h.pipeline(["a", "b"], PARALLELISM=2, QUEUE_LIMIT=2),
        COMPETING="YES",
        ORPHAN_TIMEOUT="3 s",
        POLL_INTERVAL="1 s",
    )
    d1, d2 = h.start(conf), h.start(conf)
    n = 300
    h.enqueue("a", [{"do": "sleep:0.005;next"} for _ in range(n)])
    for value in ("1", "3", "2"):
        wait_until(lambda: running_rows(h) > 0 or h.counts().get("done") == n, 20)
        h.set_config("stage-b", "PARALLELISM", value)
        time.sleep(0.3)
    counts = h.wait_all(timeout=120)
    assert counts == {"done": n}, counts
    per = Counter((r.wq_id, r.stage) for r in h.wlog().runs)
    assert max(per.values()) == 1, [k for k, v in per.items() if v > 1][:5]
    assert h.overlaps() == []
    assert d1.running() and d2.running()
    assert d1.terminate() == 0 and d2.terminate() == 0
