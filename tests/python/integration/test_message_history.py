"""A message's history with the real dispatcher and the SDK: an automatic retry
after a handler exception (its traceback stored, not logged line by line), a
crash retried and then failed, and what ``pepsi-queue show`` prints of it."""

from __future__ import annotations

import json
import subprocess

import pytest
from dispatch_harness import PYTHON, ROOT, Harness, harness_fixture, wait_until  # noqa: F401

SDK_WORKER = ROOT / "tests/python/support/workers/sdk_scripted_worker.py"
QUEUE = PYTHON.parent / "pepsi-queue"


def history(h: Harness, message_id: int) -> list[dict]:
    cur = h.conn.execute("SELECT * FROM pepsi.message_history(%s)", (message_id,))
    names = [c.name for c in cur.description or ()]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


@pytest.mark.parametrize("commit", ["--default-commit", "--group-commit"])
def test_history_across_a_retry_and_a_crash(h: Harness, commit: str) -> None:
    program = f"{PYTHON} {SDK_WORKER} {commit} --stages a,b,c"
    conf = h.conf(
        {
            "a": {"PROGRAM": program, "NEXT": "b", "RETRY_DELAY": "300 ms", "MAX_RETRIES": 1},
            "b": {"PROGRAM": program},
            # the crashing stage alone: its crash releases nothing of the others
            "c": {"PROGRAM": program, "RETRY_DELAY": "300 ms", "MAX_RETRIES": 1},
        }
    )
    d = h.start(conf)
    (crashy,) = h.enqueue("c", [{"plan": {"c": {"op": "exit", "code": 3}}}])
    flaky, plain = h.enqueue(
        "a",
        [
            {
                "plan": {
                    "a": {"op": "raise", "message": "upstream exploded", "below": 1},
                    "b": {"op": "finish"},
                }
            },
            {"plan": {"a": {"op": "advance", "to": "b"}, "b": {"op": "finish"}}},
        ],
    )
    h.wait_all(timeout=60)
    assert (h.row(flaky)["status"], h.row(crashy)["status"]) == ("done", "failed")

    got = history(h, flaky)
    assert [(x["attempt"], x["stage"], x["outcome"]) for x in got] == [
        (1, "a", "failed"),
        (None, "a", "done"),  # the retry finished (the scripted "raise ... below")
    ], got
    first = got[0]
    assert first["reason"] == "1 ValueError: upstream exploded", first
    assert first["started_at"] is not None and first["ended_at"] >= first["started_at"]
    assert "Traceback (most recent call last)" in first["traceback"]
    assert first["traceback"].rstrip().endswith("ValueError: upstream exploded")

    got = history(h, crashy)
    assert [(x["attempt"], x["stage"], x["outcome"]) for x in got] == [
        (1, "c", "crash"),
        (2, "c", "crash"),
    ], got
    assert all(x["reason"].startswith("worker exited with code 3") for x in got), got

    assert history(h, plain) == [
        {
            "attempt": None,
            "stage": "b",
            "started_at": None,
            "ended_at": h.row(plain)["updated_at"],
            "outcome": "done",
            "reason": None,
            "traceback": None,
        }
    ], "a message that just went through: nothing recorded, its end read from the row"
    assert h.conn.execute(
        "SELECT count(*) FROM pepsi.attempts WHERE workqueue_id = %s", (plain,)
    ).fetchone() == (0,)

    # The traceback is in the history, not ~10 lines of the dispatcher's log.
    wait_until(lambda: f"pepsi-queue show {flaky}" in d.log(), 10, message=d.tail)
    assert "Traceback (most recent call last)" not in d.log()

    env = {"PEPSI_DSN": h.dsn, "PATH": "/usr/bin:/bin", "HOME": str(h.tmp), "LANG": "C.UTF-8"}
    r = subprocess.run(
        [str(QUEUE), "show", str(crashy)], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert "retries     1 of 1" in r.stdout
    lines = [x for x in r.stdout.splitlines() if " crash " in x]
    assert len(lines) == 2 and all("worker exited with code 3" in x for x in lines), r.stdout
    r = subprocess.run(
        [str(QUEUE), "show", str(flaky), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    story = json.loads(r.stdout)
    assert [x["outcome"] for x in story["history"]] == ["failed", "done"]
    assert "ValueError: upstream exploded" in story["history"][0]["traceback"]
    r = subprocess.run(
        [str(QUEUE), "show", str(flaky)], env=env, capture_output=True, text=True, timeout=60
    )
    assert "| ValueError: upstream exploded" in r.stdout, r.stdout
    assert d.terminate() == 0
