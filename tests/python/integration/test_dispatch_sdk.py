"""The real dispatcher driving stage programs written with the Python worker SDK
(tests/python/sdk_scripted_worker.py): stage fusion accounting and group commit end to end,
and the SDK's workers across a kill -9 of their dispatcher.
"""

from __future__ import annotations

import pytest
from dispatch_harness import PYTHON, ROOT, Harness, harness_fixture, pid_alive, wait_until  # noqa: F401

SDK_WORKER = "tests/python/sdk_scripted_worker.py"


def sdk_conf(h: Harness, group_commit: bool, **stage_opts):
    program = f"{PYTHON} {ROOT / SDK_WORKER}" + (" --group-commit" if group_commit else "")
    conf_path = h.tmp / "pepsi.conf"
    stages = {
        "a": {"PROGRAM": program, "NEXT": "b", **stage_opts},
        "b": {"PROGRAM": program, "NEXT": "c", **stage_opts},
        "c": {"PROGRAM": program, **stage_opts},
    }
    # the workers read the same file (for NEXT) through -c CONFIG_FILE
    return h.conf(stages, CONFIG_FILE=str(conf_path))


PLAIN = {
    "plan": {
        "a": {"op": "advance", "to": "b"},
        "b": {"op": "advance", "to": "c"},
        "c": {"op": "finish"},
    }
}
FUSED = {
    "plan": {
        "a": {"op": "advance", "to": "b", "fuse": True},
        "b": {"op": "advance", "to": "c"},
        "c": {"op": "finish"},
    }
}


@pytest.mark.parametrize("group_commit", [False, True], ids=["single", "group-commit"])
def test_sdk_pipeline_with_fusion_and_stats(h: Harness, group_commit: bool) -> None:
    d = h.start(sdk_conf(h, group_commit, PARALLELISM=2, QUEUE_LIMIT=4))
    n_plain, n_fused = 60, 40
    h.enqueue("a", [PLAIN] * n_plain + [FUSED] * n_fused)
    counts = h.wait_all(timeout=90)
    assert counts == {"done": n_plain + n_fused}, counts
    stages = h.conn.execute("SELECT DISTINCT stage FROM pepsi.workqueue").fetchall()
    assert stages == [("c",)]
    n = n_plain + n_fused
    expected = {"messages": 3 * n_plain + 2 * n_fused, "stage_runs": 3 * n}
    ds = wait_until(
        lambda: h.dispatch_stats()["messages"] == expected["messages"] and h.dispatch_stats(),
        10,
        message=lambda: f"stats {expected}: {h.dispatch_stats()}",
    )
    assert ds["stage_runs"] == expected["stage_runs"], ds
    ss = h.stage_stats()
    assert {s: ss[s]["processed"] for s in "abc"} == {"a": n, "b": n, "c": n}, ss
    assert d.terminate() == 0


def test_sdk_workers_across_kill9(h: Harness) -> None:
    conf = sdk_conf(h, True, PARALLELISM=2, QUEUE_LIMIT=4)
    n = 300
    h.enqueue("a", [PLAIN] * (n // 2) + [FUSED] * (n // 2))
    for _ in range(2):
        d = h.start(conf)
        before = h.counts().get("done", 0)
        wait_until(lambda before=before: h.counts().get("done", 0) >= before + 20, 60)
        workers = [p for pids in d.workers().values() for p in pids]
        d.kill9()
        wait_until(
            lambda workers=workers: not [p for p in workers if pid_alive(p)],
            5,
            message="SDK workers die with their dispatcher",
        )
    d = h.start(conf)
    counts = h.wait_all(timeout=120)
    assert counts == {"done": n}, counts
    assert d.terminate() == 0
