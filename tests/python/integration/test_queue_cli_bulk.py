"""pepsi-queue requeue/cancel on a filter, as a real process: list's filter options
select what they act on, a count and a confirmation come first (a prompt on a
terminal; --yes or --dry-run otherwise), one SQL call acts on the whole filter
(no row cap), dedupe keys are kept, and messages that arrive after the count are
left alone."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

EXE = Path(sys.executable).parent / "pepsi-queue"


@pytest.fixture
def env(dsn: str, tmp_path: Path) -> dict[str, str]:
    if not EXE.exists():
        pytest.skip("pepsi-queue console script not installed")
    return {"PEPSI_DSN": dsn, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}


@pytest.fixture
def pq(env: dict[str, str]):
    """pepsi-queue with stdin not a terminal (/dev/null); returns the CompletedProcess."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(EXE), *args],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run


class Terminal:
    """pepsi-queue on a pseudo-terminal: read what it prints, answer its prompt."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        import pty

        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child
            os.execve(str(EXE), [str(EXE), *args], env)
        self.out = b""

    def read_until(self, text: bytes, timeout: float = 30.0) -> str:
        """Everything printed once ``text`` is among it (fails after ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while text not in self.out:
            left = deadline - time.monotonic()
            assert left > 0, f"no {text!r} in {self.out!r}"
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:  # the child closed the terminal
                    chunk = b""
                assert chunk, f"ended without {text!r}: {self.out!r}"
                self.out += chunk
        return self.out.decode()

    def answer(self, line: str) -> None:
        os.write(self.fd, line.encode() + b"\n")

    def finish(self) -> tuple[int, str]:
        """(exit code, everything printed)."""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.out += chunk
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        return os.waitstatus_to_exitcode(status), self.out.decode().replace("\r\n", "\n")


def seed(conn: psycopg.Connection) -> dict[str, int]:
    """Failed rows of two stages, two payloads, two ages; a pending one; a done one."""
    conn.execute(
        "SELECT pepsi.register_stages(1, ARRAY['a', 'b'], NULL, NULL, NULL, NULL, NULL, NULL)"
    )
    names = ("a7_old", "a7_new", "a8_old", "b7_old", "a7_pending", "a7_done")
    values = [
        ("a", "failed", {"customer": 7}, "bad input n=1", 2),
        ("a", "failed", {"customer": 7}, "bad input n=2", 0),
        ("a", "timeout", {"customer": 8}, "timed out", 2),
        ("b", "failed", {"customer": 7}, "bad input n=3", 2),
        ("a", "pending", {"customer": 7}, None, 2),
        ("a", "done", {"customer": 7}, None, 2),
    ]
    ids = {}
    for name, (stage, status, payload, error, hours) in zip(names, values, strict=True):
        ids[name] = conn.execute(
            "INSERT INTO pepsi.workqueue (stage, status, payload, state, updated_at)"
            " VALUES (%s, %s, %s, jsonb_strip_nulls(jsonb_build_object('error', %s::text)),"
            " now() - make_interval(hours => %s)) RETURNING workqueue_id",
            (stage, status, json.dumps(payload), error, hours),
        ).fetchone()[0]
    return ids


def statuses(conn: psycopg.Connection) -> dict[int, str]:
    return dict(conn.execute("SELECT workqueue_id, status FROM pepsi.messages").fetchall())


def test_requeue_on_a_filter_asks_on_a_terminal_and_acts_on_what_it_counted(env, conn, pq) -> None:
    ids = seed(conn)
    before = statuses(conn)
    # Declined: nothing moves, exit 1.
    t = Terminal(env, "requeue", "--stage", "a", "--where", '{"customer": 7}')
    shown = t.read_until(b"Requeue them? [y/N]")
    assert "would requeue 2 message(s) matching --stage a --where '{\"customer\": 7}'" in shown
    t.answer("n")
    rc, out = t.finish()
    assert rc == 1 and "nothing requeued" in out, out
    assert statuses(conn) == before
    # Accepted: the two counted move; one that fails after the count stays failed.
    t = Terminal(env, "requeue", "--stage", "a", "--where", '{"customer": 7}')
    t.read_until(b"Requeue them? [y/N]")
    [late] = conn.execute(
        "INSERT INTO pepsi.workqueue (stage, status, payload, state)"
        " VALUES ('a', 'failed', '{\"customer\": 7}', '{\"error\": \"late\"}')"
        " RETURNING workqueue_id"
    ).fetchone()
    t.answer("y")
    rc, out = t.finish()
    assert rc == 0 and out.rstrip().endswith("requeued 2 message(s)"), out
    now = statuses(conn)
    assert now[ids["a7_old"]] == now[ids["a7_new"]] == "pending"
    assert now[late] == "failed", "a message that failed after the count was requeued"
    others = {k: v for k, v in ids.items() if k not in ("a7_old", "a7_new")}
    assert {now[i] for i in others.values()} == {"timeout", "failed", "pending", "done"}
    assert [now[others[k]] for k in others] == [before[others[k]] for k in others]


def test_requeue_on_a_filter_without_a_terminal_needs_yes_or_dry_run(conn, pq) -> None:
    ids = seed(conn)
    before = statuses(conn)
    r = pq("requeue", "--stage", "a", "--older-than", "1h")
    assert r.returncode == 2, r
    assert r.stdout == "would requeue 2 message(s) matching --stage a --older-than 1h\n"
    assert "stdin is not a terminal" in r.stderr and "--yes" in r.stderr
    r = pq("requeue", "--stage", "a", "--older-than", "1h", "--dry-run")
    assert (r.returncode, r.stdout) == (
        0,
        "would requeue 2 message(s) matching --stage a --older-than 1h\n",
    )
    assert statuses(conn) == before
    r = pq("requeue", "--stage", "a", "--older-than", "1h", "--yes")
    assert (r.returncode, r.stdout) == (0, "requeued 2 message(s)\n"), r
    now = statuses(conn)
    assert now[ids["a7_old"]] == now[ids["a8_old"]] == "pending"
    assert now[ids["a7_new"]] == now[ids["b7_old"]] == "failed"


def test_bulk_actions_select_what_list_lists(conn, pq) -> None:
    seed(conn)
    filters = [
        ["--stage", "a"],
        ["--status", "timeout"],
        ["--older-than", "90m"],
        ["--where", '{"customer": 7}'],
        ["--payload-contains", '{"customer": 7}', "--status", "failed,timeout"],
        ["--reason", "bad input n=<n>"],
        ["--reason", "bad input n=<n>", "--stage", "b"],
    ]
    for args in filters:
        listed = json.loads(pq("list", *args, "--limit", "10000", "--json").stdout)
        want = sum(1 for m in listed if m["status"] in ("failed", "timeout", "expired"))
        r = pq("requeue", *args, "--dry-run")
        assert r.returncode == 0, (args, r.stderr)
        assert r.stdout.startswith(f"would requeue {want} message(s) matching"), (args, r.stdout)
    listed = json.loads(pq("list", "--reason", "bad input n=<n>", "--json").stdout)
    assert len(listed) == 3 and {m["stage"] for m in listed} == {"a", "b"}
    # cancel's selection: the same filter, pending and paused rows.
    listed = json.loads(pq("list", "--where", '{"customer": 7}', "--json").stdout)
    want = sum(1 for m in listed if m["status"] in ("pending", "paused"))
    r = pq("cancel", "--where", '{"customer": 7}', "--dry-run")
    assert r.stdout == f"would cancel {want} message(s) matching --where '{{\"customer\": 7}}'\n"


def test_cancel_on_a_filter_leaves_running_and_other_rows(conn, pq) -> None:
    conn.execute("SELECT pepsi.register_stages(1, ARRAY['c'], NULL, NULL, NULL, NULL, NULL, NULL)")
    made = conn.execute(
        "INSERT INTO pepsi.workqueue (stage, status, payload, dispatcher_id, timeout) VALUES"
        " ('c', 'pending', '{\"n\": 1}', NULL, NULL),"
        " ('c', 'paused', '{\"n\": 1}', NULL, now() + interval '1 h'),"
        " ('c', 'running', '{\"n\": 1}', 1, now() + interval '1 h'),"
        " ('c', 'pending', '{\"n\": 2}', NULL, NULL) RETURNING workqueue_id"
    ).fetchall()
    r = pq("cancel", "--stage", "c", "--where", '{"n": 1}', "--yes")
    assert (r.returncode, r.stdout) == (0, "cancelled 2 message(s)\n"), r
    got = [statuses(conn)[i] for (i,) in made]
    assert got == ["failed", "failed", "running", "pending"]
    r = pq("cancel", "--status", "failed", "--yes")
    assert r.returncode == 2 and "pending, paused" in r.stderr, r.stderr
    assert pq("cancel", "--reason", "x", "--yes").returncode == 2  # cancel has no --reason


def test_requeue_on_a_filter_keeps_dedupe_keys(conn, pq) -> None:
    conn.execute("SELECT pepsi.register_stages(1, ARRAY['k'], NULL, NULL, NULL, NULL, NULL, NULL)")
    conn.execute(
        "INSERT INTO pepsi.workqueue (stage, status, state, dedupe_key) VALUES"
        " ('k', 'failed', '{\"error\": \"x\"}', 'one'),"
        " ('k', 'failed', '{\"error\": \"x\"}', 'two'),"
        " ('k', 'pending', '{}', 'two')"
    )
    r = pq("requeue", "--stage", "k", "--yes")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("requeued 1 message(s); 1 left as they were:"), r.stdout
    assert "dedupe key" in r.stdout
    kept = conn.execute(
        "SELECT status FROM pepsi.workqueue WHERE dedupe_key = 'two' ORDER BY workqueue_id"
    ).fetchall()
    assert kept == [("failed",), ("pending",)]


def test_bulk_requeue_has_no_row_cap(conn, pq) -> None:
    conn.execute(
        "INSERT INTO pepsi.workqueue (stage, status, state)"
        " SELECT 'a', 'failed', '{\"error\": \"x\"}' FROM generate_series(1, 10001)"
    )
    conn.execute("SELECT pepsi.register_stages(1, ARRAY['a'], NULL, NULL, NULL, NULL, NULL, NULL)")
    r = pq("requeue", "--all", "--yes")
    assert (r.returncode, r.stdout) == (0, "requeued 10001 message(s)\n"), r


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["requeue"], "say which messages"),
        (["requeue", "--all", "--stage", "a"], "--all cannot be combined"),
        (["requeue", "--id", "1", "--where", "{}"], "--id takes no filter but --stage"),
        (["cancel", "--id", "1", "--dry-run"], "--dry-run counts what a filter selects"),
        (["requeue", "--status", "pending"], "not a status this command acts on"),
        (["requeue", "--stage", "a", "--older-than", "soon"], "--older-than"),
    ],
)
def test_bulk_selection_usage_errors(pq, args: list[str], says: str) -> None:
    r = pq(*args)
    assert r.returncode == 2 and says in r.stderr, r.stderr
