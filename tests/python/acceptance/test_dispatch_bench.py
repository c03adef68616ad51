"""Throughput and latency of the real dispatcher with real (Python + psycopg) workers.

Run alone, with the numbers printed:
    .venv/bin/pytest -s tests/python/acceptance/test_dispatch_bench.py
PEPSI_BENCH_MESSAGES (default 5000; the issue asks for 20000) sets the size of the run:
    PEPSI_BENCH_MESSAGES=20000 .venv/bin/pytest -s tests/python/acceptance/test_dispatch_bench.py
The no-op stage program is tests/python/support/workers/scripted_worker.py: per message one
SELECT of the row and one pepsi.advance/finish (two round trips), answered "0".
"""

from __future__ import annotations

import json
import os
import statistics
import time

from dispatch_harness import Harness, harness_fixture, read_worker_log, wait_until  # noqa: F401


def test_throughput_three_stage_noop(h: Harness) -> None:
    n = int(os.environ.get("PEPSI_BENCH_MESSAGES", "2000"))
    stages = h.pipeline(["a", "b", "c"])  # PARALLELISM 4, QUEUE_LIMIT 4 (defaults)
    for opts in stages.values():
        opts["PROGRAM"] = opts["PROGRAM"].replace(str(h.worker_log), str(h.tmp / "bench.log"))
    d = h.start(h.conf(stages, STATS_INTERVAL="1 s"))
    t0 = time.monotonic()
    h.enqueue("a", n)
    h.wait_all("done", timeout=600)
    elapsed = time.monotonic() - t0
    assert h.counts() == {"done": n}
    ds = wait_until(lambda: h.dispatch_stats()["stage_runs"] == 3 * n and h.dispatch_stats(), 10)
    assert ds["messages"] == 3 * n
    result = {
        "messages": n,
        "stages": 3,
        "seconds": round(elapsed, 2),
        "messages_per_s": round(n / elapsed, 1),
        "stage_runs_per_s": round(3 * n / elapsed, 1),
    }
    print("THROUGHPUT", json.dumps(result))
    (h.tmp / "throughput.json").write_text(json.dumps(result))
    assert d.terminate() == 0


def test_idle_enqueue_to_worker_latency(h: Harness) -> None:
    d = h.start(h.conf(h.pipeline(["a"]), WORKER_IDLE_TIMEOUT="60 s"))
    h.enqueue("a", 1)  # warm one worker up
    h.wait_all("done", timeout=30)
    samples = []
    for _ in range(200):
        before = time.monotonic_ns()
        (i,) = h.enqueue("a", 1)
        wait_until(lambda i=i: h.row(i)["status"] == "done", 10, 0.001)
        (run,) = read_worker_log(h.worker_log).runs_of(i)
        samples.append((run.start - before) / 1e6)
        time.sleep(0.01)
    samples.sort()
    p50 = statistics.median(samples)
    p99 = samples[int(len(samples) * 0.99) - 1]
    result = {
        "samples": len(samples),
        "p50_ms": round(p50, 2),
        "p99_ms": round(p99, 2),
        "max_ms": round(samples[-1], 2),
    }
    print("LATENCY", json.dumps(result))
    assert p50 < 100, result
    assert d.terminate() == 0


def test_peers_bench_table_and_costs(h: Harness, capsys, monkeypatch) -> None:
    """`make bench BENCH_ARGS=--peers` machinery, ours and the pgbench floor only (no
    install): one table with medians and ratios, and the per-message cost table."""
    from pepsi_dispatch.devtools.bench import peer_drivers as bench_peer_drivers
    from pepsi_dispatch.devtools.bench import peers as bench_peers

    monkeypatch.setattr(bench_peer_drivers, "SETTLE", 0.0)  # the statistics' lag is not tested
    floor = bench_peers.pgbench_floor  # a floor of 1 s instead of 5: its value is not tested
    monkeypatch.setattr(
        bench_peers, "pgbench_floor", lambda dsn, clients=8: floor(dsn, clients, seconds=1)
    )

    rc = bench_peers.main(
        h.dsn,
        messages=300,
        runs=1,
        folder=h.tmp / "peers",
        timeout=120,
        only="throughput settings: raw|shipped defaults \\(SDK",
        costs=True,
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "| pepsi-dispatch, throughput settings: raw worker, P4 × Q64 |" in out
    assert "| pepsi-dispatch, shipped defaults (SDK, PARALLELISM 4 only) |" in out
    assert "| pgbench floor: one-row-update commits, 8 clients (tps) |" in out
    assert "| pgbench floor: one-row-update commits, 4 clients (tps) |" in out
    assert "per message (median of 1 runs" in out
    assert "at a service already running and idle" in out  # the default clock
    assert not (h.tmp / "peers").exists()  # nothing installed for our systems alone


def test_bench_floor_and_replicas_rows(h: Harness, capsys) -> None:
    """`make bench BENCH_ARGS='--floor --replicas 2'`: the floor (the drain's statements
    in a bare loop) and two competing dispatchers drain every message, and each row
    of ours gets its ratio to one dispatcher and to the floor. The figures are not
    tested; that the runs finish everything, and say so, is."""
    from pepsi_dispatch.devtools.bench.__main__ import main as bench_main
    from pepsi_dispatch.devtools.bench.floor import floor

    bare = floor(h.dsn, 300, 2, 4)
    assert bare["done"] == 300 and bare["msg_per_s"] > 0
    assert h.conn.execute("SELECT count(*) FROM pepsi.workqueue").fetchone() == (0,)
    assert h.conn.execute("SELECT count(*) FROM pepsi.dispatchers").fetchone() == (0,)

    os.environ["PEPSI_DSN"] = h.dsn
    try:
        argv = ["--worker", "sdk-default", "--stages", "1", "--parallelism", "2"]
        argv += ["--queue-limit", "4", "--messages", "200", "--latency", "0"]
        rc = bench_main([*argv, "--floor", "--replicas", "2"])
    finally:
        del os.environ["PEPSI_DSN"]
    out = capsys.readouterr().out
    assert rc in (0, None), out
    assert "sdk-default ×2 competing" in out and "× one dispatcher)" in out, out
    assert "× the floor)" in out and "bare loop on 2 connection(s)" in out, out
    assert out.count("not done 0,") == 2, out
