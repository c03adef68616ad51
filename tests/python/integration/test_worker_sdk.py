"""The Python worker SDK (pepsi_dispatch.worker), driven directly over its pipes.

The test plays the dispatcher: it registers a dispatcher id, claims rows with
pepsi.claim (so they are running and held), starts
tests/python/support/workers/sdk_scripted_worker.py with PEPSI_STAGE, PEPSI_DSN and
PEPSI_DISPATCHER_ID, writes ids to its stdin and reads the answers. Every payload
scripts what the handler does (see that file).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

HERE = Path(__file__).resolve().parents[1]
PROGRAM = HERE / "support" / "workers" / "sdk_scripted_worker.py"

GRAPH = """
[stage-a]
PROGRAM = /bin/true
NEXT = b c
[stage-b]
PROGRAM = /bin/true
NEXT = c
[stage-c]
PROGRAM = /bin/true
NEXT = d
[stage-d]
PROGRAM = /bin/true
"""


class Worker:
    """One SDK worker process and the dispatcher's view of it."""

    def __init__(
        self,
        dsn: str,
        conf: Path,
        dispatcher_id: int | None,
        stage: str = "a",
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        environ = {
            **os.environ,
            "PEPSI_STAGE": stage,
            "PEPSI_DSN": dsn,
            "PEPSI_DISPATCHER_ID": "" if dispatcher_id is None else str(dispatcher_id),
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            [sys.executable, str(PROGRAM), *extra, "-c", str(conf), "worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environ,
        )
        self._buf = b""

    def send(self, *ids: int | str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("".join(f"{i}\n" for i in ids).encode())
        self.proc.stdin.flush()

    def answer(self, timeout: float = 20.0) -> str | None:
        """Next answer line, or None at EOF."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no answer within {timeout}s; stderr: {self.stderr()}")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def close(self, timeout: float = 20.0) -> int:
        assert self.proc.stdin is not None
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        return self.proc.wait(timeout)

    def wait_for_stderr(self, marker: bytes, timeout: float = 20.0) -> bytes:
        """Wait until ``marker`` appears on the worker's stderr; what was read (it is
        consumed)."""
        assert self.proc.stderr is not None
        seen = b""
        deadline = time.monotonic() + timeout
        while marker not in seen:
            assert time.monotonic() < deadline, f"{marker!r} never reached stderr"
            ready, _, _ = select.select([self.proc.stderr.fileno()], [], [], 1)
            if ready:
                seen += os.read(self.proc.stderr.fileno(), 4096)
        return seen

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(running)"
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    path = tmp_path / "pepsi.conf"
    path.write_text(GRAPH)
    return path


@pytest.fixture
def did(conn: psycopg.Connection) -> int:
    conn.execute("CREATE TABLE public.sdk_log (id bigint, note text)")
    return conn.execute("SELECT pepsi.register_dispatcher('test', 1, false)").fetchone()[0]


@pytest.fixture
def workers() -> Any:
    started: list[Worker] = []
    yield started
    for w in started:
        w.kill()


def enqueue_claimed(
    conn: psycopg.Connection, did: int, *plans: dict, stage: str = "a"
) -> list[int]:
    """Enqueue one message per plan at `stage` and claim them all for `did`."""
    ids = [
        conn.execute("SELECT pepsi.enqueue(%s, %s)", (stage, Jsonb({"plan": p}))).fetchone()[0]
        for p in plans
    ]
    claimed = conn.execute(
        "SELECT workqueue_id FROM pepsi.claim(%s, %s, %s)", (did, [stage], [len(ids)])
    ).fetchall()
    assert sorted(r[0] for r in claimed) == sorted(ids)
    return ids


def row(conn: psycopg.Connection, mid: int) -> dict[str, Any]:
    r = conn.execute(
        "SELECT stage, status, retries, state, timeout - now(), dispatcher_id"
        " FROM pepsi.messages WHERE workqueue_id = %s",
        (mid,),
    ).fetchone()
    assert r is not None
    keys = ("stage", "status", "retries", "state", "due_in", "dispatcher_id")
    return dict(zip(keys, r, strict=True))


def start(workers: list[Worker], dsn: str, conf: Path, did: int | None, **kw: Any) -> Worker:
    w = Worker(dsn, conf, did, **kw)
    workers.append(w)
    return w


def run_one(dsn, conf, did, workers, conn, plan, **kw) -> tuple[str | None, dict[str, Any]]:
    (mid,) = enqueue_claimed(conn, did, plan)
    w = start(workers, dsn, conf, did, **kw)
    w.send(mid)
    answer = w.answer()
    assert w.close() == 0
    return answer, row(conn, mid)


# ---------------------------------------------------------------- handler outcomes


def test_finish(dsn, conf, did, workers, conn):
    answer, r = run_one(dsn, conf, did, workers, conn, {"a": {"op": "finish"}})
    assert answer == "0"
    assert r["status"] == "done" and r["dispatcher_id"] is None
    assert r["state"]["seen"] == ["a"]  # msg.state changes are merged into the row


def test_advance_to_allowed_successor(dsn, conf, did, workers, conn):
    answer, r = run_one(dsn, conf, did, workers, conn, {"a": {"op": "advance", "to": "c"}})
    assert answer == "0"
    assert (r["stage"], r["status"], r["retries"]) == ("c", "pending", 0)


def test_forbidden_advance_refused_with_clear_error(dsn, conf, did, workers, conn):
    answer, r = run_one(dsn, conf, did, workers, conn, {"a": {"op": "advance", "to": "d"}})
    assert answer is not None and answer.startswith("1 ")
    assert "may not advance to d" in answer
    assert "allowed successors: b, c" in answer
    assert (r["stage"], r["status"]) == ("a", "failed")
    assert "allowed successors: b, c" in r["state"]["error"]


def test_advance_from_final_stage_refused(dsn, conf, did, workers, conn):
    (mid,) = enqueue_claimed(conn, did, {"d": {"op": "advance", "to": "a"}}, stage="d")
    w = start(workers, dsn, conf, did, stage="d")
    w.send(mid)
    answer = w.answer()
    assert answer is not None and "d is a final stage" in answer
    assert row(conn, mid)["status"] == "failed"
    assert w.close() == 0


def test_pause_seconds_with_reason(dsn, conf, did, workers, conn):
    plan = {"a": {"op": "pause", "seconds": 30, "reason": "source flaky"}}
    answer, r = run_one(dsn, conf, did, workers, conn, plan)
    assert answer == "0"
    assert (r["stage"], r["status"]) == ("a", "paused")
    assert 25 < r["due_in"].total_seconds() <= 30
    assert r["state"]["pause_reason"] == "source flaky"


def test_fail_with_reason(dsn, conf, did, workers, conn):
    answer, r = run_one(dsn, conf, did, workers, conn, {"a": {"op": "fail", "reason": "bad\ndoc"}})
    assert answer == "1 bad doc"  # newlines never break the protocol
    assert r["status"] == "failed" and r["state"]["error"] == "bad doc"


def test_none_means_only_successor_or_finish(dsn, conf, did, workers, conn):
    # b has one successor (c): None advances there
    (mid_b,) = enqueue_claimed(conn, did, {"b": {"op": "none"}}, stage="b")
    w = start(workers, dsn, conf, did, stage="b")
    w.send(mid_b)
    assert w.answer() == "0"
    assert w.close() == 0
    assert (row(conn, mid_b)["stage"], row(conn, mid_b)["status"]) == ("c", "pending")
    # d is final: None finishes
    (mid_d,) = enqueue_claimed(conn, did, {"d": {"op": "none"}}, stage="d")
    w = start(workers, dsn, conf, did, stage="d")
    w.send(mid_d)
    assert w.answer() == "0"
    assert w.close() == 0
    assert row(conn, mid_d)["status"] == "done"
    # a has two successors: None is refused
    answer, r = run_one(dsn, conf, did, workers, conn, {"a": {"op": "none"}})
    assert answer is not None and answer.startswith("1 ") and "several successors" in answer
    assert r["status"] == "failed"


def test_bad_return_value_fails_message(dsn, conf, did, workers, conn):
    answer, r = run_one(dsn, conf, did, workers, conn, {"a": {"op": "bogus"}})
    assert answer is not None and answer.startswith("1 ") and "returned str" in answer
    assert r["status"] == "failed"


def test_exception_fails_message_and_worker_lives_on(dsn, conf, did, workers, conn):
    ids = enqueue_claimed(
        conn,
        did,
        {"a": {"op": "raise", "message": "boom\nsecond line", "insert": "undone"}},
        {"a": {"op": "finish", "insert": "kept"}},
    )
    w = start(workers, dsn, conf, did)
    w.send(*ids)
    assert w.answer() == "1 ValueError: boom second line"
    assert w.answer() == "0"
    assert w.close() == 0
    assert row(conn, ids[0])["status"] == "failed"
    assert row(conn, ids[0])["state"]["error"] == "ValueError: boom second line"
    assert row(conn, ids[1])["status"] == "done"
    # what the failing handler wrote through msg.db was rolled back with it
    notes = conn.execute("SELECT id, note FROM public.sdk_log ORDER BY id").fetchall()
    assert notes == [(ids[1], "kept")]
    # The traceback goes to the message's history; stderr (the dispatcher's log) gets one line.
    err = w.stderr()
    assert "Traceback" not in err
    assert f"message {ids[0]}: ValueError: boom second line (traceback:" in err
    (trace,) = conn.execute(
        "SELECT traceback FROM pepsi.message_history(%s) WHERE attempt = 1", (ids[0],)
    ).fetchone()
    assert trace.startswith("Traceback (most recent call last)") and "boom" in trace


def test_prints_go_to_stderr_not_the_protocol(dsn, conf, did, workers, conn):
    ids = enqueue_claimed(
        conn,
        did,
        {"a": {"op": "finish", "print": "hello from the handler"}},
        {"a": {"op": "finish"}},
    )
    w = start(workers, dsn, conf, did)
    w.send(*ids)
    assert w.answer() == "0"
    assert w.answer() == "0"
    assert w.close() == 0
    assert "hello from the handler" in w.stderr()


# ---------------------------------------------------------------- fencing and bad input


def test_row_held_by_another_dispatcher_is_not_touched(dsn, conf, did, workers, conn):
    (mid,) = enqueue_claimed(conn, did, {"a": {"op": "finish"}})
    w = start(workers, dsn, conf, did + 1000)  # a stale dispatcher id: the row is not ours
    w.send(mid)
    answer = w.answer()
    assert answer == (
        f"1 message {mid} is no longer held by dispatcher {did + 1000}"
        f" (it is running at stage a under dispatcher {did}); not started"
    )
    assert w.close() == 0
    r = row(conn, mid)
    assert (r["status"], r["dispatcher_id"]) == ("running", did)


def _starts(log: Path) -> list[int]:
    """The ids whose handler started, from the scripted worker's --log."""
    if not log.exists():
        return []
    return [
        int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith("START")
    ]


def _take_over(conn: psycopg.Connection, ids: list[int]) -> int:
    """What a replica that declared ours dead does: the rows, reset, claimed by it."""
    other = conn.execute("SELECT pepsi.register_dispatcher('other', 2, true)").fetchone()[0]
    conn.execute(
        "UPDATE pepsi.workqueue SET dispatcher_id = %s WHERE workqueue_id = ANY(%s)", (other, ids)
    )
    return other


@pytest.mark.parametrize("extra", [(), ("--group-commit",)], ids=["single", "group-commit"])
def test_a_message_taken_over_is_answered_without_starting_its_handler(
    dsn, conf, did, workers, conn, tmp_path, extra
):
    """The row was ours when its id was written; another dispatcher holds it when the
    worker reads it (ours was declared dead while the worker was frozen): no handler runs."""
    log = tmp_path / "starts.log"
    mine, theirs = enqueue_claimed(conn, did, {"a": {"op": "finish"}}, {"a": {"op": "finish"}})
    other = _take_over(conn, [theirs])
    w = start(workers, dsn, conf, did, extra=(*extra, "--log", str(log)))
    w.send(mine, theirs)
    assert w.answer() == "0"
    assert w.answer() == (
        f"1 message {theirs} is no longer held by dispatcher {did}"
        f" (it is running at stage a under dispatcher {other}); not started"
    )
    assert w.close() == 0
    assert _starts(log) == [mine]
    assert (row(conn, theirs)["status"], row(conn, theirs)["dispatcher_id"]) == ("running", other)
    assert row(conn, mine)["status"] == "done"


@pytest.mark.parametrize("extra", [(), ("--group-commit",)], ids=["single", "group-commit"])
def test_a_running_handler_pins_its_row_against_a_replicas_reset(
    dsn, conf, did, workers, conn, tmp_path, extra
):
    """While the handler runs, a replica that declares our dispatcher dead cannot reset
    the row (its reset skips the locked row at once instead of waiting); the handler's
    transition then commits. What is pinned is what has started: the whole batch with
    group commit, the message in hand with one commit per message -- there the next
    one is reset, and then not started."""
    log = tmp_path / "starts.log"
    ids = enqueue_claimed(conn, did, *[{"a": {"op": "finish", "sleep": 1.0}}] * 2)
    w = start(workers, dsn, conf, did, extra=(*extra, "--log", str(log)))
    w.send(*ids)  # group commit: one batch, both rows pinned as it begins
    deadline = time.monotonic() + 20
    while not _starts(log):
        assert time.monotonic() < deadline, f"the handler never started: {w.stderr()}"
        time.sleep(0.02)
    other = conn.execute("SELECT pepsi.register_dispatcher('other', 2, true)").fetchone()[0]
    conn.execute("DELETE FROM pepsi.dispatchers WHERE dispatcher_id = %s", (did,))  # dead
    conn.execute("SET lock_timeout = '5s'")
    t0 = time.monotonic()
    reset = conn.execute("SELECT pepsi.reset_orphans(%s, true, '0 s')", (other,)).fetchone()[0]
    assert time.monotonic() - t0 < 2.0  # skipped, not waited for
    answers = [w.answer(), w.answer()]
    assert w.close() == 0
    if extra:
        assert reset == 0
        assert answers == ["0", "0"]
        assert [row(conn, i)["status"] for i in ids] == ["done", "done"]
        assert _starts(log) == ids
    else:
        assert reset == 1
        assert answers == [
            "0",
            f"1 message {ids[1]} is not running at stage a (it is pending at stage a)",
        ]
        assert [row(conn, i)["status"] for i in ids] == ["done", "pending"]
        assert _starts(log) == ids[:1]


def test_row_not_running_and_garbage_lines(dsn, conf, did, workers, conn):
    pending = conn.execute("SELECT pepsi.enqueue('a', '{}')").fetchone()[0]
    w = start(workers, dsn, conf, did)
    w.send(pending, "not-a-number", 987654321)
    assert w.answer() == f"1 message {pending} is not running at stage a (it is pending at stage a)"
    assert w.answer() == "1 not a message id: not-a-number"
    assert w.answer() == "1 message 987654321 does not exist"
    assert w.close() == 0
    assert row(conn, pending)["status"] == "pending"


def test_eof_exits_zero(dsn, conf, did, workers, conn):
    w = start(workers, dsn, conf, did)
    assert w.close() == 0
    assert w.answer() is None


def test_start_errors_exit_2(dsn, conf, did, workers, conn):
    w = start(workers, dsn, conf, did, stage="zzz")
    assert w.close() == 2
    assert "no handler for stage zzz" in w.stderr()
    w = start(workers, dsn, conf, did, env={"PEPSI_STAGE": ""})
    assert w.close() == 2
    assert "PEPSI_STAGE is not set" in w.stderr()


# ---------------------------------------------------------------- signals


@pytest.mark.parametrize("extra", [(), ("--group-commit",)], ids=["single", "group-commit"])
def test_sigterm_mid_message_finishes_it_then_exits(dsn, conf, did, workers, conn, extra):
    ids = enqueue_claimed(
        conn,
        did,
        {"a": {"op": "finish", "print": "handler started", "sleep": 1.5}},
        {"a": {"op": "finish"}},
    )
    w = start(workers, dsn, conf, did, extra=extra)
    w.send(*ids)
    w.wait_for_stderr(b"handler started")  # the first handler runs
    w.proc.send_signal(signal.SIGTERM)
    assert w.answer() == "0"  # the message in hand is finished and answered
    assert w.answer() is None  # and the next one is not started
    assert w.proc.wait(20) == 0
    assert row(conn, ids[0])["status"] == "done"
    assert row(conn, ids[1])["status"] == "running"  # the dispatcher requeues it


def test_sigterm_while_idle_exits_zero(dsn, conf, did, workers, conn):
    (mid,) = enqueue_claimed(conn, did, {"a": {"op": "finish"}})
    w = start(workers, dsn, conf, did)
    w.send(mid)
    assert w.answer() == "0"
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(20) == 0


# ---------------------------------------------------------------- fusion


def test_fusion_runs_successors_in_one_pass(dsn, conf, did, workers, conn):
    plan = {
        "a": {"op": "advance", "to": "b", "fuse": True, "insert": "a"},
        "b": {"op": "advance", "to": "c", "fuse": True, "state": {"from_b": 1}},
        "c": {"op": "advance", "to": "d"},
    }
    answer, r = run_one(dsn, conf, did, workers, conn, plan)
    assert answer == "0 fused=b,c"
    assert (r["stage"], r["status"]) == ("d", "pending")
    assert r["state"]["seen"] == ["a", "b", "c"] and r["state"]["from_b"] == 1
    assert conn.execute("SELECT note FROM public.sdk_log").fetchall() == [("a",)]


def test_pause_after_fused_hop_retries_at_fused_stage(dsn, conf, did, workers, conn):
    plan = {"a": {"op": "advance", "to": "b", "fuse": True}, "b": {"op": "pause", "seconds": 5}}
    answer, r = run_one(dsn, conf, did, workers, conn, plan)
    assert answer == "0 fused=b"
    assert (r["stage"], r["status"]) == ("b", "paused")


def test_failure_in_fused_stage_recorded_there(dsn, conf, did, workers, conn):
    plan = {
        "a": {"op": "advance", "to": "b", "fuse": True, "insert": "a"},
        "b": {"op": "raise", "message": "no", "insert": "b"},
    }
    answer, r = run_one(dsn, conf, did, workers, conn, plan)
    assert answer == "1 [b] ValueError: no"
    assert (r["stage"], r["status"]) == ("b", "failed")
    # stage a's work and hop stand, stage b's own writes are undone
    assert conn.execute("SELECT note FROM public.sdk_log").fetchall() == [("a",)]


def test_forbidden_fused_advance_refused(dsn, conf, did, workers, conn):
    plan = {"a": {"op": "advance", "to": "d", "fuse": True}}
    answer, r = run_one(dsn, conf, did, workers, conn, plan)
    assert answer is not None and "allowed successors: b, c" in answer
    assert (r["stage"], r["status"]) == ("a", "failed")


def test_fuse_without_handler_is_a_plain_advance(dsn, conf, did, workers, conn):
    plan = {"a": {"op": "advance", "to": "b", "fuse": True}}
    answer, r = run_one(dsn, conf, did, workers, conn, plan, extra=("--stages", "a"))
    assert answer == "0"
    assert (r["stage"], r["status"]) == ("b", "pending")


def test_overlay_graph_applies(dsn, conf, did, workers, conn):
    conn.execute("INSERT INTO pepsi.config VALUES ('stage-a', 'NEXT', 'b c d')")
    answer, r = run_one(dsn, conf, did, workers, conn, {"a": {"op": "advance", "to": "d"}})
    assert answer == "0"
    assert (r["stage"], r["status"]) == ("d", "pending")


# ---------------------------------------------------------------- group commit


def test_group_commit_one_transaction_savepoint_per_message(dsn, conf, did, workers, conn):
    plans = [{"a": {"op": "finish", "insert": f"m{i}"}} for i in range(6)]
    plans[2] = {"a": {"op": "raise", "message": "third", "insert": "undone"}}
    plans[4] = {"a": {"op": "advance", "to": "c"}}
    ids = enqueue_claimed(conn, did, *plans)
    w = start(workers, dsn, conf, did, extra=("--group-commit",))
    w.send(*ids)  # one write: all ids are buffered when the worker reads
    answers = [w.answer() for _ in ids]
    assert answers == ["0", "0", "1 ValueError: third", "0", "0", "0"]
    assert w.close() == 0
    statuses = [row(conn, i)["status"] for i in ids]
    assert statuses == ["done", "done", "failed", "done", "pending", "done"]
    notes = [n for (n,) in conn.execute("SELECT note FROM public.sdk_log ORDER BY id")]
    assert notes == ["m0", "m1", "m3", "m5"]
    # one transaction: now() (the transaction's start time) stamped every row alike
    stamps = conn.execute(
        "SELECT count(DISTINCT updated_at) FROM pepsi.messages WHERE workqueue_id = ANY(%s)",
        (ids,),
    ).fetchone()[0]
    assert stamps == 1


def test_group_commit_exit_in_a_later_handler_answers_the_earlier_ones(
    dsn, conf, did, workers, conn
):
    """A handler that ends the process (sys.exit) in the middle of a group: the
    messages before it are committed and answered first, so the dispatcher's
    crash rule blames the message that exited, not the group's first one."""
    plans = [{"a": {"op": "finish", "insert": f"m{i}"}} for i in range(4)]
    plans[2] = {"a": {"op": "exit", "code": 3, "insert": "undone"}}
    ids = enqueue_claimed(conn, did, *plans)
    w = start(workers, dsn, conf, did, extra=("--group-commit",))
    w.send(*ids)  # one write: all ids are buffered when the worker reads
    assert [w.answer(), w.answer()] == ["0", "0"]
    assert w.answer() is None  # it exited without answering the third
    assert w.close() == 3
    statuses = [row(conn, i)["status"] for i in ids]
    assert statuses == ["done", "done", "running", "running"]
    notes = [n for (n,) in conn.execute("SELECT note FROM public.sdk_log ORDER BY id")]
    assert notes == ["m0", "m1"]


MIXED_PLANS = [
    {"a": {"op": "finish"}},
    {"a": {"op": "advance", "to": "b"}},
    {"a": {"op": "advance", "to": "c", "state": {"k": 1}}},
    {"a": {"op": "pause", "seconds": 30, "reason": "later"}},
    {"a": {"op": "fail", "reason": "bad"}},
    {"a": {"op": "raise", "message": "boom"}},
    {"a": {"op": "advance", "to": "d"}},
    {"a": {"op": "advance", "to": "b", "fuse": True}, "b": {"op": "pause", "seconds": 9}},
    {
        "a": {"op": "advance", "to": "b", "fuse": True},
        "b": {"op": "advance", "to": "c", "fuse": True, "state": {"x": [1]}},
        "c": {"op": "none"},
    },
    {"a": {"op": "advance", "to": "b", "fuse": True}, "b": {"op": "fail", "reason": "in b"}},
    {"a": {"op": "finish", "insert": "db"}},
    {"a": {"op": "advance", "to": "b"}},
    {"a": {"op": "finish"}},
]


@pytest.mark.parametrize("fence", [True, False], ids=["fenced", "no-dispatcher-id"])
def test_group_commit_matches_one_commit_per_message(dsn, conf, did, workers, conn, fence):
    """The same mixed batch gives the same rows and answers with and without group commit."""
    results = {}
    for mode, extra in (("single", ()), ("group", ("--group-commit",))):
        ids = enqueue_claimed(conn, did, *MIXED_PLANS)
        w = start(workers, dsn, conf, did if fence else None, extra=extra)
        w.send(*ids)
        answers = [w.answer() for _ in ids]
        assert w.close() == 0
        rows = []
        for i in ids:
            r = row(conn, i)
            rows.append((r["stage"], r["status"], r["retries"], r["state"]))
        results[mode] = (answers, rows)
    assert results["group"] == results["single"]
    answers, rows = results["group"]
    assert answers[7] == "0 fused=b" and rows[7][:2] == ("b", "paused")
    assert answers[8] == "0 fused=b,c" and rows[8][:2] == ("d", "pending")
    assert answers[9] == "1 [b] in b" and rows[9][:2] == ("b", "failed")
    assert [s for _, s, _, _ in rows].count("failed") == 4


def test_group_commit_row_of_another_dispatcher_answered_per_message(dsn, conf, did, workers, conn):
    mine = enqueue_claimed(conn, did, {"a": {"op": "finish"}}, {"a": {"op": "advance", "to": "b"}})
    other = conn.execute("SELECT pepsi.register_dispatcher('other', 2, false)").fetchone()[0]
    (theirs,) = enqueue_claimed(conn, other, {"a": {"op": "finish"}})
    w = start(workers, dsn, conf, did, extra=("--group-commit",))
    w.send(mine[0], theirs, mine[1])
    assert w.answer() == "0"
    lost = w.answer()
    assert lost is not None and lost.startswith("1 ") and lost.endswith("; not started")
    assert w.answer() == "0"
    assert w.close() == 0
    assert row(conn, theirs)["status"] == "running"
    assert row(conn, mine[0])["status"] == "done"
    assert row(conn, mine[1])["status"] == "pending"


def test_state_changes_in_place_and_bad_values(dsn, conf, did, workers, conn):
    ids = enqueue_claimed(
        conn,
        did,
        {"a": {"op": "finish", "append": "x"}},
        {"a": {"op": "finish", "unjson": True}},
        {"a": {"op": "badpause"}},
    )
    conn.execute(
        'UPDATE pepsi.workqueue SET state = \'{"log": ["old"]}\' WHERE workqueue_id = %s',
        (ids[0],),
    )
    w = start(workers, dsn, conf, did, extra=("--group-commit",))
    w.send(*ids)
    assert w.answer() == "0"
    bad_state = w.answer()
    assert bad_state is not None and "msg.state cannot be stored as JSON" in bad_state
    bad_pause = w.answer()
    assert bad_pause is not None and "Pause needs seconds" in bad_pause
    assert w.close() == 0
    assert row(conn, ids[0])["state"]["log"] == ["old", "x"]  # nested in-place change kept
    assert [row(conn, i)["status"] for i in ids] == ["done", "failed", "failed"]


@pytest.mark.parametrize("extra", [(), ("--group-commit",)], ids=["single", "group-commit"])
def test_lost_connection_reconnects_and_redoes_message(dsn, conf, did, workers, conn, extra):
    ids = enqueue_claimed(
        conn,
        did,
        {"a": {"op": "advance", "to": "b", "print": "handler started", "sleep": 1.0}},
        {"a": {"op": "finish"}},
    )
    w = start(workers, dsn, conf, did, extra=extra)
    w.send(*ids)
    seen = w.wait_for_stderr(b"handler started")
    killed = conn.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE application_name = 'pepsi-worker a' AND datname = current_database()"
    ).fetchone()[0]
    assert killed == 1
    assert w.answer() == "0"
    assert w.answer() == "0"
    assert w.close() == 0
    assert [row(conn, i)["status"] for i in ids] == ["pending", "done"]
    assert row(conn, ids[0])["stage"] == "b"
    assert b"reconnected" in seen + w.proc.stderr.read()


@pytest.mark.parametrize("extra", [(), ("--group-commit",)], ids=["single", "group-commit"])
def test_a_redo_whose_claim_was_lost_answers_1_and_runs_nothing(
    dsn, conf, did, workers, conn, extra
):
    """The connection is lost mid-handler and, when the worker is back, its row is
    pending at its own stage again: the claim did not survive (a standby promoted
    before the claim reached it). Answered 1 and not run (answering 0 counted a
    success that never happened, and the message then ran again elsewhere)."""
    ids = enqueue_claimed(
        conn,
        did,
        {"a": {"op": "advance", "to": "b", "print": "handler started", "sleep": 1.0}},
        {"a": {"op": "finish"}},
    )
    w = start(workers, dsn, conf, did, extra=extra)
    w.send(*ids)
    seen = w.wait_for_stderr(b"handler started")
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = 'pepsi-worker a' AND datname = current_database()"
    )
    # Waits for the dying backend's row lock; done long before the handler's sleep ends.
    conn.execute(
        "UPDATE pepsi.workqueue SET status = 'pending', dispatcher_id = NULL"
        " WHERE workqueue_id = %s",
        (ids[0],),
    )
    first = w.answer()
    assert first is not None and first.startswith(
        f"1 message {ids[0]} is pending at stage a again: its claim was lost"
    ), first
    assert w.answer() == "0"
    assert w.close() == 0
    assert (row(conn, ids[0])["stage"], row(conn, ids[0])["status"]) == ("a", "pending")
    assert row(conn, ids[1])["status"] == "done"
    assert b"claim was lost" in seen + w.proc.stderr.read()


def test_unmigrated_database_exits_2_with_a_hint(empty_dsn, conf, workers):
    w = start(workers, empty_dsn, conf, None)
    assert w.close() == 2
    err = w.stderr()
    assert "not migrated" in err and "alembic upgrade head" in err
    assert "Traceback" not in err


# ---------------------------------------------------------------- group commit's batch, in process


def test_group_batch_failing_midway_undoes_its_whole_pipeline(dsn, conn, did):
    """The batch's BEGIN, statements and COMMIT go in one pipeline; an error in it
    must undo what ran before the error and leave the connection out of any
    transaction, ready for the next batch."""
    from pepsi_dispatch.sdk.message import Finish
    from pepsi_dispatch.sdk.statements import Statement, Statements
    from pepsi_dispatch.sdk.transaction import BatchFailed, GroupBatch

    a, b = enqueue_claimed(conn, did, {}, {})
    s = Statements(did)
    with psycopg.connect(dsn, autocommit=True) as work:
        batch = GroupBatch(work)
        batch.slot = 0
        batch.defer(s.transition(a, "a", Finish()))  # runs, then is undone
        batch.slot = 1
        batch.defer(s.set_state(b, "a", '{"x": 1}'))
        batch.defer(Statement("advance", (b, "a", "no such stage!", did), "lost"))  # raises
        with pytest.raises(BatchFailed, match="group commit batch failed"):
            batch.commit()
        assert work.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert row(conn, a)["status"] == "running"
        assert row(conn, b)["state"] in ({}, None)
        again = GroupBatch(work)
        again.defer(s.transition(a, "a", Finish()))
        again.commit()
    assert row(conn, a)["status"] == "done"


def test_group_batch_advances_of_one_stage_through_advance_many(dsn, conn, did):
    """Advances of one stage to one stage are one pepsi.advance_many (migration 0015):
    the rows still ours move on, the one another dispatcher holds is reported lost
    for its message alone."""
    from pepsi_dispatch.sdk.message import Advance
    from pepsi_dispatch.sdk.statements import Statements
    from pepsi_dispatch.sdk.transaction import GroupBatch

    a, b = enqueue_claimed(conn, did, {}, {})
    other = conn.execute("SELECT pepsi.register_dispatcher('other', 2, false)").fetchone()[0]
    (theirs,) = enqueue_claimed(conn, other, {})
    s = Statements(did)
    with psycopg.connect(dsn, autocommit=True) as work:
        batch = GroupBatch(work)
        for slot, mid in enumerate((a, theirs, b)):
            batch.slot = slot
            batch.defer(s.transition(mid, "a", Advance("b")))
        batch.commit()
    assert list(batch.lost) == [1] and f"message {theirs} changed nothing" in batch.lost[1]
    for mid in (a, b):
        r = row(conn, mid)
        moved = (r["stage"], r["status"], r["retries"], r["dispatcher_id"])
        assert moved == ("b", "pending", 0, None)
    assert row(conn, theirs)["status"] == "running" and row(conn, theirs)["stage"] == "a"


def test_group_commit_on_a_database_without_advance_many_goes_row_by_row(
    dsn, conf, did, workers, conn
):
    """A newer SDK on a database not yet migrated to advance_many (an upgrade's
    window): its batches still advance, row by row, instead of failing."""
    from pepsi_dispatch.sdk.facts import set_based_kinds

    conn.execute("DROP FUNCTION pepsi.advance_many(bigint[], text, text, bigint)")
    assert set_based_kinds(conn) == frozenset({"finish"})
    ids = enqueue_claimed(conn, did, *({"a": {"op": "advance", "to": "b"}} for _ in range(3)))
    w = start(workers, dsn, conf, did, extra=("--group-commit",))
    w.send(*ids)
    assert [w.answer() for _ in ids] == ["0", "0", "0"]
    assert w.close() == 0
    assert [(row(conn, i)["stage"], row(conn, i)["status"]) for i in ids] == [("b", "pending")] * 3


@pytest.mark.parametrize("extra", [(), ("--group-commit",)], ids=["single", "group-commit"])
def test_one_id_written_twice_runs_its_handler_once(dsn, conf, did, workers, conn, extra):
    """Both copies arrive in one read. The second copy's row is read after the first
    copy committed: it is no longer running, so its handler does not run again."""
    first, other = enqueue_claimed(
        conn, did, {"a": {"op": "finish", "print": "handler ran"}}, {"a": {"op": "finish"}}
    )
    w = start(workers, dsn, conf, did, extra=extra)
    w.send(first, other, first)
    assert w.answer() == "0"
    assert w.answer() == "0"
    again = w.answer()
    assert again == f"1 message {first} is not running at stage a (it is done at stage a)"
    assert w.close() == 0
    assert w.stderr().count("handler ran") == 1


def test_group_commit_failing_statement_fails_only_its_own_message(dsn, conf, did, workers, conn):
    """A batch of 8 whose third handler stores a string with a NUL in msg.state:
    its set_state fails in the database and aborts the group's transaction. Only
    that message fails; the other seven are committed and answered, and the
    worker lives on (it answers the next batch)."""
    plans = [{"a": {"op": "finish", "state": {"n": i}}} for i in range(8)]
    plans[2] = {"a": {"op": "finish", "nul": True}}
    plans[5] = {"a": {"op": "advance", "to": "b", "insert": "m5"}}
    ids = enqueue_claimed(conn, did, *plans)
    w = start(workers, dsn, conf, did, extra=("--group-commit",))
    w.send(*ids)  # one write: all 8 are buffered when the worker reads
    answers = [w.answer() for _ in ids]
    assert [a[:1] for a in answers] == ["0", "0", "1", "0", "0", "0", "0", "0"], answers
    assert "database error" in answers[2] and "\\u0000" in answers[2]
    statuses = [row(conn, i)["status"] for i in ids]
    assert statuses == ["done", "done", "failed", "done", "done", "pending", "done", "done"]
    assert row(conn, ids[2])["state"]["error"] == answers[2][2:]
    assert row(conn, ids[7])["state"]["n"] == 7
    notes = [n for (n,) in conn.execute("SELECT note FROM public.sdk_log ORDER BY id")]
    assert notes == ["m5"]
    (more,) = enqueue_claimed(conn, did, {"a": {"op": "finish"}})
    w.send(more)
    assert w.answer() == "0"
    assert w.close() == 0


def _in_hand_slot() -> tuple[int, Any]:
    """A memfd slot as the dispatcher offers it: (its fd, its mapping)."""
    import mmap

    fd = os.memfd_create("pepsi-inhand", 0)
    os.ftruncate(fd, 8)
    return fd, mmap.mmap(fd, 8)


def _in_hand(slot: Any) -> int:
    import struct

    return struct.unpack_from("=q", slot, 0)[0]


def _start_with_slot(dsn: str, conf: Path, did: int, fd: int) -> subprocess.Popen[bytes]:
    """The scripted worker at its default commit mode, offered the slot ``fd``."""
    environ = {
        **os.environ,
        "PEPSI_STAGE": "a",
        "PEPSI_DSN": dsn,
        "PEPSI_DISPATCHER_ID": str(did),
        "PEPSI_INHAND_FD": str(fd),
    }
    proc = subprocess.Popen(
        [sys.executable, str(PROGRAM), "--default-commit", "-c", str(conf), "worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environ,
        pass_fds=(fd,),
    )
    os.close(fd)
    return proc


def test_sigkilled_group_names_the_message_in_hand(dsn, conf, did, conn):
    """Offered the in-hand slot, the SDK commits in groups by default and keeps
    the id of the message whose handler runs in the slot: after a SIGKILL in the
    third handler of a batch of five, the slot names the third message, and
    nothing of the batch committed."""
    fd, slot = _in_hand_slot()
    plans = [{"a": {"op": "finish", "insert": f"m{i}"}} for i in range(5)]
    plans[2] = {"a": {"op": "kill"}}
    ids = enqueue_claimed(conn, did, *plans)
    proc = _start_with_slot(dsn, conf, did, fd)
    try:
        out, _ = proc.communicate("".join(f"{i}\n" for i in ids).encode(), timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert out == b""  # nothing answered: the group never committed
    assert _in_hand(slot) == ids[2]
    assert [row(conn, i)["status"] for i in ids] == ["running"] * 5
    assert conn.execute("SELECT count(*) FROM public.sdk_log").fetchone()[0] == 0


def test_in_hand_slot_reads_none_between_messages(dsn, conf, did, conn):
    """Once the batch is answered the slot reads -1 (no handler runs); the batch
    was one transaction (group commit is the default with the slot)."""
    fd, slot = _in_hand_slot()
    ids = enqueue_claimed(conn, did, *({"a": {"op": "finish"}} for _ in range(4)))
    proc = _start_with_slot(dsn, conf, did, fd)
    try:
        out, _ = proc.communicate("".join(f"{i}\n" for i in ids).encode(), timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert out == b"0\n" * 4
    assert _in_hand(slot) == -1
    stamps = conn.execute(
        "SELECT count(DISTINCT updated_at) FROM pepsi.messages WHERE workqueue_id = ANY(%s)",
        (ids,),
    ).fetchone()[0]
    assert stamps == 1


def test_group_commit_slow_handlers_do_not_hold_earlier_answers(dsn, conf, did, workers, conn):
    """A group takes no more messages once its handlers ran GROUP_WINDOW (0.5 s):
    four handlers of 0.3 s each are committed and answered as two groups, so the
    first answer does not wait for the fourth handler."""
    ids = enqueue_claimed(conn, did, *({"a": {"op": "finish", "sleep": 0.3}} for _ in range(4)))
    w = start(workers, dsn, conf, did, extra=("--group-commit",))
    t0 = time.monotonic()
    w.send(*ids)
    assert w.answer() == "0"
    first = time.monotonic() - t0
    assert [w.answer() for _ in range(3)] == ["0", "0", "0"]
    total = time.monotonic() - t0
    assert w.close() == 0
    assert total - first >= 0.5  # the second group's two handlers ran after the first answer
    stamps = conn.execute(
        "SELECT count(DISTINCT updated_at) FROM pepsi.messages WHERE workqueue_id = ANY(%s)",
        (ids,),
    ).fetchone()[0]
    assert stamps == 2


def test_group_commit_reads_the_next_batch_ahead_in_order(dsn, conf, did, workers, conn):
    """Ids written while a group runs are taken with its commit (their rows read in
    the commit's round trip) and served next, in order: a second copy of an id of
    the group sees the row as the group committed it (not running: answered 1,
    its handler not run again), and the others run once each."""
    plans = [{"a": {"op": "finish", "sleep": 0.2}} for _ in range(3)]
    plans[0]["a"]["print"] = "first group"
    first = enqueue_claimed(conn, did, *plans)
    w = start(workers, dsn, conf, did, extra=("--group-commit",))
    w.send(*first)
    w.wait_for_stderr(b"first group")  # the group runs: what comes now waits for it
    second = enqueue_claimed(conn, did, *({"a": {"op": "finish", "insert": "m"}} for _ in range(3)))
    w.send(second[0], first[1], second[1], second[2])  # while the first group runs
    answers = [w.answer() for _ in range(7)]
    assert answers[:4] == ["0", "0", "0", "0"], answers
    assert answers[4].startswith(f"1 message {first[1]} is not running at stage a"), answers
    assert answers[5:] == ["0", "0"], answers
    assert w.close() == 0
    assert [row(conn, i)["status"] for i in first + second] == ["done"] * 6
    assert conn.execute("SELECT count(*) FROM public.sdk_log").fetchone()[0] == 3


def test_group_commit_loads_the_waiting_ids_in_its_commit_round_trip(dsn, did, conn):
    """In process: ids that wait on stdin when a group commits are taken then, and
    their rows come back with the commit (no load of their own): the next group
    uses them."""
    from pepsi_dispatch.sdk.connection import ConnectionHolder
    from pepsi_dispatch.sdk.message import Finish
    from pepsi_dispatch.sdk.routing import HandlerDispatch, StageGraph
    from pepsi_dispatch.sdk.runner import StageRunner
    from pepsi_dispatch.sdk.statements import Statements
    from pepsi_dispatch.sdk.transaction import CommitMode

    first = enqueue_claimed(conn, did, {}, {})
    second = enqueue_claimed(conn, did, {}, {})
    r, w = os.pipe()
    answers_r, answers_w = os.pipe()
    graph = StageGraph({"a": ()}, "test")
    dispatch = HandlerDispatch({"a": lambda msg: Finish()}, "a", graph, Statements(did))
    holder = ConnectionHolder(psycopg.connect(dsn, autocommit=True))
    runner = StageRunner(dispatch, holder, CommitMode.GROUP, answers_w, r)
    try:
        os.write(w, "".join(f"{i}\n" for i in first).encode())
        lines = runner.reader.lines()
        os.write(w, "".join(f"{i}\n" for i in second).encode())
        runner._run_batch(lines)
        assert os.read(answers_r, 100) == b"0\n0\n"
        assert runner._ahead_lines == [str(i).encode() for i in second]
        assert runner._ahead_rows is not None and sorted(runner._ahead_rows) == second
        assert {row[2] for row in runner._ahead_rows.values()} == {"running"}
        os.close(w)
        assert runner.serve() == 0  # serves the lines read ahead, then EOF
        assert os.read(answers_r, 100) == b"0\n0\n"
        assert runner._ahead_rows is None  # used once
    finally:
        holder.close()
        for fd in (r, answers_r, answers_w):
            os.close(fd)
    assert [row(conn, i)["status"] for i in first + second] == ["done"] * 4


ENDING_PLANS = [
    {"a": {"op": "finish", "insert": "m0"}},
    {"a": {"op": "fail", "reason": "bad"}},
    {"a": {"op": "advance", "to": "b", "state": {"k": 2}}},
    None,  # the handler that ends its transaction (below)
    {"a": {"op": "finish", "insert": "m4"}},
    {"a": {"op": "advance", "to": "c"}},
]


ENDINGS = ["commit()", "rollback()", "COMMIT", "ROLLBACK", "COMMIT AND CHAIN"]


@pytest.mark.parametrize("how", ENDINGS)
@pytest.mark.parametrize("extra", [("--group-commit",), ()], ids=["group", "per-message"])
def test_a_handler_that_commits_or_rolls_back_fails_alone(
    dsn, conf, did, workers, conn, how, extra
):
    """The fourth handler of a batch commits or rolls back on msg.db (the
    connection's methods, which psycopg refuses inside the SDK's transaction, or
    SQL, which ends it: in group commit, the batch's). That message fails with a
    reason saying so; the others end as their handlers said, each once (in group
    commit, those a ROLLBACK undid run again, once); nothing stays open or
    locked, and the worker lives on."""
    plans = list(ENDING_PLANS)
    plans[3] = {"a": {"op": "finish", "insert": "m3", "end_tx": how}}
    ids = enqueue_claimed(conn, did, *plans)
    w = start(workers, dsn, conf, did, extra=extra)
    w.send(*ids)  # one write: all ids are buffered when the worker reads
    answers = [w.answer() for _ in ids]
    assert [a[:1] for a in answers] == ["0", "1", "0", "1", "0", "0"], answers
    assert answers[1] == "1 bad"
    assert "may not commit or roll back the transaction it runs in" in answers[3]
    assert ("called msg.db." in answers[3]) == how.endswith("()"), answers[3]
    rows = [row(conn, i) for i in ids]
    assert [(r["stage"], r["status"]) for r in rows] == [
        ("a", "done"),
        ("a", "failed"),
        ("b", "pending"),
        ("a", "failed"),
        ("a", "done"),
        ("c", "pending"),
    ]
    assert rows[2]["state"]["k"] == 2
    assert rows[3]["state"]["error"] == answers[3][2:]
    notes = [n for (n,) in conn.execute("SELECT note FROM public.sdk_log ORDER BY id, note")]
    # what the handler wrote before its COMMIT stays committed; nothing twice
    assert notes == (["m0", "m3", "m4"] if how.startswith("COMMIT") else ["m0", "m4"]), notes
    # nothing open or locked: the worker's session is idle between messages
    sessions = conn.execute(
        "SELECT a.state, (SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid"
        " AND l.locktype IN ('transactionid', 'tuple'))"
        " FROM pg_stat_activity a WHERE a.application_name = 'pepsi-worker a'"
    ).fetchall()
    assert sessions == [("idle", 0)], sessions
    (more,) = enqueue_claimed(conn, did, {"a": {"op": "finish", "insert": "more"}})
    w.send(more)
    assert w.answer() == "0"
    assert w.close() == 0
