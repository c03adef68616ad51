"""The test workers themselves, driven by hand over the pipe protocol (no dispatcher).

These make sure a failing dispatcher test is about the dispatcher, not about the worker:
the test plays dispatcher (register, claim, write ids, read answers).
"""

from __future__ import annotations

import os
import shlex
import subprocess

from dispatch_harness import Harness, harness_fixture  # noqa: F401


def claim(h: Harness, stage: str, n: int) -> tuple[int, list[int]]:
    did = h.conn.execute(
        "SELECT pepsi.register_dispatcher('test', %s, false)", (os.getpid(),)
    ).fetchone()[0]
    rows = h.conn.execute(
        "SELECT workqueue_id FROM pepsi.claim(%s, %s, %s)", (did, [stage], [n])
    ).fetchall()
    return did, sorted(r[0] for r in rows)


def run_worker(h: Harness, program: str, stage: str, did: int, ids: list[int]) -> list[str]:
    proc = subprocess.run(
        [*shlex.split(program), "worker"],
        input="".join(f"{i}\n" for i in ids),
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "PEPSI_STAGE": stage,
            "PEPSI_DSN": h.dsn,
            "PEPSI_DISPATCHER_ID": str(did),
        },
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_scripted_worker_actions(h: Harness) -> None:
    ids = h.enqueue(
        "a",
        [
            {},
            {"do": "finish"},
            {"do": "fail"},
            {"do": "sqlfail"},
            {"do": "leave_running"},
            {"do": "pause:60"},
            {"do": "sleep:0.1;fuse:b,c"},
            {"do_a": "advance:c", "do": "finish"},
            {"do": ["stderr_flood:300000", "next"]},
        ],
    )
    did, claimed = claim(h, "a", 100)
    assert claimed == ids
    answers = run_worker(h, h.program({"a": "b"}), "a", did, ids)
    assert answers == [
        "0",
        "0",
        "3 scripted failure",
        "0",
        "0",
        "0",
        "0 fused=b,c",
        "0",
        "0",
    ]
    st = [(h.row(i)["stage"], h.row(i)["status"]) for i in ids]
    assert st == [
        ("b", "pending"),
        ("a", "done"),
        ("a", "running"),
        ("a", "failed"),
        ("a", "running"),
        ("a", "paused"),
        ("a", "done"),
        ("c", "pending"),
        ("b", "pending"),
    ]
    log = h.wlog()
    assert sorted(r.wq_id for r in log.runs) == ids
    assert all(r.end is not None for r in log.runs)
    assert max(log.queue_max.values()) == len(ids)  # all written at once, all seen


def test_scripted_worker_crashes(h: Harness) -> None:
    (i,) = h.enqueue("a", [{"do": "exit:3"}])
    did, _ = claim(h, "a", 1)
    env = {**os.environ, "PEPSI_STAGE": "a", "PEPSI_DSN": h.dsn, "PEPSI_DISPATCHER_ID": str(did)}
    proc = subprocess.run(
        [*shlex.split(h.program()), "worker"], input=f"{i}\n".encode(), env=env, capture_output=True
    )
    assert proc.returncode == 3
    (j,) = h.enqueue("b", [{"do": "segv"}])
    did, _ = claim(h, "b", 1)
    env["PEPSI_STAGE"], env["PEPSI_DISPATCHER_ID"] = "b", str(did)
    proc = subprocess.run(
        [*shlex.split(h.program()), "worker"], input=f"{j}\n".encode(), env=env, capture_output=True
    )
    assert proc.returncode == -11


def test_shell_worker(h: Harness) -> None:
    ids = h.enqueue("a", 3)
    did, _ = claim(h, "a", 3)
    assert run_worker(h, h.shell_program({"a": "b"}), "a", did, ids) == ["0", "0", "0"]
    assert {h.row(i)["stage"] for i in ids} == {"b"}
    did, claimed = claim(h, "b", 3)
    assert claimed == ids
    # a wrong fencing token: the transition does not apply, the worker says so
    answers = run_worker(h, h.shell_program({"a": "b"}), "b", did + 1000, ids[:1])
    assert answers[0].startswith("1 ")
    assert run_worker(h, h.shell_program({"a": "b"}), "b", did, ids) == ["0", "0", "0"]
    assert {h.row(i)["status"] for i in ids} == {"done"}


def test_overlap_checker_has_teeth(tmp_path) -> None:
    from dispatch_harness import read_worker_log

    log = tmp_path / "w.log"
    log.write_text(
        "RECV 1 100 a 10\nSTART 1 100 a 11\nEND 1 100 a 20\nANSWER 1 100 a 21\n"
        # id 2: handed to pid 101 while pid 100 still held it unanswered (never started)
        "RECV 2 100 a 12\nRECV 2 101 a 15\nSTART 2 101 a 16\nEND 2 101 a 17\n"
        "ANSWER 2 101 a 18\nANSWER 2 100 a 22\n"
        # id 3: worked on by two workers at once at the same stage
        "START 3 100 a 30\nSTART 3 101 a 31\nEND 3 101 a 32\nEND 3 100 a 33\n"
        # id 4: killed run (no END), rerun after the death: fine when open_until says so
        "START 4 100 a 40\nSTART 4 101 a 50\nEND 4 101 a 51\n"
        # id 5: next stage started right after the previous stage's commit: not counted
        "START 5 100 a 60\nSTART 5 101 b 61\nEND 5 100 a 62\nEND 5 101 b 63\n"
    )
    w = read_worker_log(log)
    assert {a.wq_id for a, _ in w.double_holds()} == {2}
    assert {a.wq_id for a, _ in w.overlaps(open_until=lambda r: 45)} == {3}
    assert {a.wq_id for a, _ in w.overlaps()} == {3, 4}
