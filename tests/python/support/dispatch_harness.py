"""Helpers for tests that run the real `pepsi-dispatch serve` process.

A `Harness` (pytest fixture `h`, built on conftest's `dsn`) writes pepsi.conf
files into the test's tmp_path, starts dispatcher processes with their output captured
to a log file, enqueues rows, polls the database, reads the test workers' log and
inspects the dispatcher's worker processes through /proc. Everything it started is
stopped when the test ends.

Test workers live in tests/python/support/workers/ (see scripted_worker.py for the payload
language and the log format).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[3]
VENV_BIN = ROOT / ".venv" / "bin"
PYTHON = VENV_BIN / "python"
DISPATCH = VENV_BIN / "pepsi-dispatch"
WORKERS = Path(__file__).resolve().parent / "workers"
SCRIPTED = WORKERS / "scripted_worker.py"
SHELL = WORKERS / "shell_worker.sh"
#: The dispatcher's line for a stage's template probe (a worker handed nothing).
PROBE_LINE = re.compile(r"worker pid (\d+) started \(\d+/\d+\) to fork the stage's template")

# Test defaults for [pepsi-dispatch]. POLL_INTERVAL is long on purpose: a test that
# passes must have been driven by notifications and answers, not by the heartbeat.
DISPATCH_DEFAULTS = {
    "SERVICE_USER": "root",
    "POLL_INTERVAL": "60 s",
    "STATS_INTERVAL": "60 s",
    "WORKER_IDLE_TIMEOUT": "2 s",
    "SHUTDOWN_TIMEOUT": "5 s",
    "MAX_RUNTIME": "60 s",
    "RETENTION": "0",
}

TERMINAL = ("done", "failed", "timeout", "expired")


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str | Callable[[], str] = "condition",
) -> Any:
    """Poll `predicate` until it returns a truthy value (returned); fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout} s waiting for {text}")
        time.sleep(interval)


# ---------------------------------------------------------------- /proc helpers


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def children_of(ppid: int) -> list[int]:
    """Live (non-zombie) direct children of `ppid`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == ppid and fields[0] != "Z":
            out.append(int(entry))
    return out


def proc_env(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def proc_cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


# ---------------------------------------------------------------- worker log


@dataclass
class Run:
    """One message in one worker: START..END (end None when the worker never finished it)."""

    wq_id: int
    pid: int
    stage: str
    start: int
    end: int | None


@dataclass
class WorkerLog:
    runs: list[Run]  # START..END: a worker working on a message
    holds: list[Run]  # RECV..ANSWER: an id read by a worker and not yet answered
    spawns: dict[int, list[str]]  # pid -> [stage, dispatcher_id, argv...]
    queue_max: dict[int, int]  # pid -> largest unanswered count seen
    exits: dict[int, str]

    def runs_of(self, wq_id: int) -> list[Run]:
        return [r for r in self.runs if r.wq_id == wq_id]

    def overlaps(self, open_until: Callable[[Run], int] | None = None) -> list[tuple[Run, Run]]:
        """Pairs of runs of one id at one stage in two workers at overlapping times.

        An unfinished run (worker killed or crashed) lasts until open_until(run), by default
        forever: it must then be the last run of its id at that stage.

        Runs at different stages are not compared: a worker logs END only after its
        transition committed, and from that commit on the row may rightly be claimed and
        started at the next stage, so such a pair can overlap by the width of that gap.
        A real double hand-out (an id re-dispatched while a worker still works on it)
        shows up as two runs at the same stage.
        """
        return _overlapping(self.runs, open_until)

    def double_holds(self, open_until: Callable[[Run], int] | None = None) -> list[tuple[Run, Run]]:
        """Pairs of RECV..ANSWER intervals of one id at one stage in two workers that
        overlap: the dispatcher handed an id to a second worker while the first had read
        it and not answered it (nor died). Stricter than overlaps(): it also sees ids
        queued in a worker that never started them."""
        return _overlapping(self.holds, open_until)


def _overlapping(runs: list[Run], open_until: Callable[[Run], int] | None) -> list[tuple[Run, Run]]:
    by_id: dict[tuple[int, str], list[Run]] = defaultdict(list)
    for r in runs:
        by_id[(r.wq_id, r.stage)].append(r)
    bad = []
    for group in by_id.values():
        group.sort(key=lambda r: r.start)
        for a, b in zip(group, group[1:], strict=False):
            end = a.end
            if end is None:
                end = open_until(a) if open_until else None
            if end is None or end > b.start:
                bad.append((a, b))
    return bad


def read_worker_log(path: Path) -> WorkerLog:
    runs: list[Run] = []
    holds: list[Run] = []
    open_runs: dict[tuple[int, int], Run] = {}
    open_holds: dict[tuple[int, int], Run] = {}
    spawns: dict[int, list[str]] = {}
    queue_max: dict[int, int] = defaultdict(int)
    exits: dict[int, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            w = line.split()
            if not w:
                continue
            if w[0] == "START" and len(w) == 5:
                run = Run(int(w[1]), int(w[2]), w[3], int(w[4]), None)
                runs.append(run)
                open_runs[(run.wq_id, run.pid)] = run
            elif w[0] == "END" and len(w) == 5:
                run = open_runs.pop((int(w[1]), int(w[2])), None)
                if run is not None:
                    run.end = int(w[4])
            elif w[0] == "RECV" and len(w) == 5 and w[1].isdigit():
                hold = Run(int(w[1]), int(w[2]), w[3], int(w[4]), None)
                holds.append(hold)
                open_holds[(hold.wq_id, hold.pid)] = hold
            elif w[0] == "ANSWER" and len(w) == 5:
                hold = open_holds.pop((int(w[1]), int(w[2])), None)
                if hold is not None:
                    hold.end = int(w[4])
            elif w[0] == "SPAWN":
                spawns[int(w[1])] = w[2:]
            elif w[0] == "QUEUE" and len(w) == 3:
                queue_max[int(w[1])] = max(queue_max[int(w[1])], int(w[2]))
            elif w[0] == "EXIT" and len(w) >= 3:
                exits[int(w[1])] = w[2]
    return WorkerLog(runs, holds, spawns, dict(queue_max), exits)


class LifeWatcher(threading.Thread):
    """Samples, every few ms, whether each test worker (SPAWN lines of the log) is alive.

    last_alive[pid] is the last CLOCK_MONOTONIC ns at which the pid was seen alive: a
    lower bound of its death. A run that never ended overlaps a later run of the same id
    for sure when that later run started before last_alive of the first worker.
    """

    def __init__(self, log_path: Path, period: float = 0.003) -> None:
        super().__init__(daemon=True)
        self.log_path, self.period = log_path, period
        self.last_alive: dict[int, int] = {}
        self.dead: set[int] = set()
        self._offset = 0
        self._halt = threading.Event()

    def _new_pids(self) -> None:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self._offset += end
        for line in data[:end].splitlines():
            if line.startswith(b"SPAWN "):
                self.last_alive.setdefault(int(line.split()[1]), time.monotonic_ns())

    def run(self) -> None:
        while not self._halt.is_set():
            self._new_pids()
            for pid in list(self.last_alive):
                if pid in self.dead:
                    continue
                now = time.monotonic_ns()
                if pid_alive(pid):
                    self.last_alive[pid] = now
                else:
                    self.dead.add(pid)
            time.sleep(self.period)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


# ---------------------------------------------------------------- dispatcher process


class Dispatcher:
    """One `pepsi-dispatch serve` process; stdout and stderr go to `log_path`."""

    def __init__(
        self,
        conf: Path,
        dsn: str,
        log_path: Path,
        args: Iterable[str] = (),
        level: str = "INFO",
        env: dict[str, str] | None = None,
    ) -> None:
        self.conf, self.dsn, self.log_path = conf, dsn, log_path
        cmd = [str(DISPATCH), "-c", str(conf), "-L", level, *args, "serve"]
        self._log_file = open(log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PEPSI_DSN": dsn, **(env or {})},
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self.seen_workers: set[int] = set()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def running(self) -> bool:
        return self.proc.poll() is None

    def dispatcher_id(self, conn: psycopg.Connection) -> int | None:
        row = conn.execute(
            "SELECT dispatcher_id FROM pepsi.dispatchers WHERE pid = %s"
            " ORDER BY dispatcher_id DESC LIMIT 1",
            (self.pid,),
        ).fetchone()
        return row[0] if row else None

    def wait_ready(self, conn: psycopg.Connection, timeout: float = 30) -> int:
        """Wait until the dispatcher has registered itself; return its dispatcher_id."""

        def ready():
            if not self.running():
                raise AssertionError(
                    f"dispatcher exited with {self.proc.returncode} before it was ready:\n"
                    + self.tail()
                )
            return self.dispatcher_id(conn)

        return wait_until(ready, timeout, 0.05, lambda: "dispatcher registration\n" + self.tail())

    def workers(self) -> dict[str, list[int]]:
        """Live worker processes (direct children) by PEPSI_STAGE."""
        out: dict[str, list[int]] = defaultdict(list)
        for pid in children_of(self.pid):
            stage = proc_env(pid).get("PEPSI_STAGE")
            if stage is None:
                continue
            self.seen_workers.add(pid)
            out[stage].append(pid)
        return dict(out)

    def wait_exit(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"dispatcher still running after {timeout} s:\n{self.tail()}"
            ) from exc

    def terminate(self, timeout: float = 30) -> int:
        if self.running():
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def kill9(self) -> None:
        """SIGKILL the dispatcher process alone (its workers must die on their own)."""
        self.workers()
        os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(10)

    def cleanup(self) -> None:
        if self.running():
            self.workers()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log_file.close()


# ---------------------------------------------------------------- the harness


class Harness:
    def __init__(self, tmp_path: Path, dsn: str) -> None:
        self.tmp = tmp_path
        os.chmod(tmp_path, 0o755)
        self.dsn = dsn
        self.worker_log = tmp_path / "workers.log"
        self.dispatchers: list[Dispatcher] = []
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.watcher = LifeWatcher(self.worker_log)
        self.watcher.start()

    def overlaps(self) -> list[tuple[Run, Run]]:
        """Runs of one id in two workers at once (START..END), and ids handed to a second
        worker while one that had read them had not answered (RECV..ANSWER), per stage.
        An open interval (its worker was killed) lasts until the worker was last seen alive."""
        self.watcher._new_pids()
        alive = self.watcher.last_alive
        log = self.wlog()
        return log.overlaps(open_until=lambda r: alive.get(r.pid, r.start)) + log.double_holds(
            open_until=lambda r: alive.get(r.pid, r.start)
        )

    # -- programs and configuration

    def program(self, nexts: dict[str, str] | None = None, log: Path | None = None) -> str:
        """PROGRAM value for the scripted worker; `nexts` maps a stage to its successor."""
        parts = [str(PYTHON), str(SCRIPTED), "--log", str(log or self.worker_log)]
        for stage, succ in (nexts or {}).items():
            parts += ["--next", f"{stage}={succ}"]
        return " ".join(parts)

    def shell_program(self, nexts: dict[str, str] | None = None) -> str:
        return " ".join(["/bin/bash", str(SHELL), *(f"{a}={b}" for a, b in (nexts or {}).items())])

    def conf(
        self, stages: dict[str, dict[str, Any]], name: str = "pepsi.conf", **dispatch: Any
    ) -> Path:
        """Write a pepsi.conf; `stages` maps a stage name to its options (PROGRAM, NEXT, ...)."""
        options = {**DISPATCH_DEFAULTS, **{k.upper(): v for k, v in dispatch.items()}}
        lines = ["# written by dispatch_harness", "[pepsi-dispatch]"]
        lines += [f"{key} = {value}" for key, value in options.items() if value is not None]
        for stage, opts in stages.items():
            lines += ["", f"[stage-{stage}]"]
            lines += [f"{key.upper()} = {value}" for key, value in opts.items()]
        path = self.tmp / name
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o644)
        return path

    def pipeline(self, stages: list[str], **stage_opts: Any) -> dict[str, dict[str, Any]]:
        """Linear pipeline of scripted-worker stages: stages[0] -> stages[1] -> ..."""
        nexts = dict(zip(stages, stages[1:], strict=False))
        program = self.program(nexts)
        out = {}
        for s in stages:
            out[s] = {"PROGRAM": program, **stage_opts}
            if s in nexts:
                out[s]["NEXT"] = nexts[s]
        return out

    # -- dispatchers

    def start(
        self,
        conf: Path,
        wait: bool = True,
        args: Iterable[str] = (),
        level: str = "INFO",
        dsn: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Dispatcher:
        n = len(self.dispatchers)
        d = Dispatcher(conf, dsn or self.dsn, self.tmp / f"dispatcher-{n}.log", args, level, env)
        self.dispatchers.append(d)
        if wait:
            d.wait_ready(self.conn if dsn is None else psycopg.connect(dsn, autocommit=True))
        return d

    # -- database

    def enqueue(self, stage: str, payloads: list[dict] | int) -> list[int]:
        """Insert rows in one statement (one notification); return their ids in order."""
        if isinstance(payloads, int):
            payloads = [{} for _ in range(payloads)]
        rows = self.conn.execute(
            "INSERT INTO pepsi.workqueue (stage, payload)"
            " SELECT %s, p FROM unnest(%s::jsonb[]) WITH ORDINALITY AS t(p, n) ORDER BY n"
            " RETURNING workqueue_id",
            (stage, [json.dumps(p) for p in payloads]),
        ).fetchall()
        return sorted(r[0] for r in rows)

    def counts(self) -> dict[str, int]:
        return dict(
            self.conn.execute(
                "SELECT status, count(*) FROM pepsi.messages GROUP BY status"
            ).fetchall()
        )

    def row(self, wq_id: int) -> dict[str, Any]:
        cur = self.conn.execute(
            "SELECT workqueue_id, stage, status, payload, state, retries, timeout,"
            " dispatcher_id, updated_at FROM pepsi.messages WHERE workqueue_id = %s",
            (wq_id,),
        )
        names = [c.name for c in cur.description]
        values = cur.fetchone()
        assert values is not None, f"row {wq_id} missing"
        return dict(zip(names, values, strict=True))

    def wait_all(
        self, status: str | Iterable[str] = TERMINAL, timeout: float = 60, where: str = "true"
    ) -> dict[str, int]:
        """Wait until every row (matching `where`) has one of `status`; return the counts."""
        statuses = [status] if isinstance(status, str) else list(status)

        def done():
            left = self.conn.execute(
                f"SELECT count(*) FROM pepsi.messages WHERE ({where}) AND status <> ALL(%s)",
                (statuses,),
            ).fetchone()[0]
            return left == 0

        wait_until(
            done,
            timeout,
            0.1,
            lambda: (
                f"all rows {statuses}: {self.counts()}\n"
                + "\n".join(d.tail(20) for d in self.dispatchers)
            ),
        )
        return self.counts()

    def stage_stats(self) -> dict[str, dict[str, Any]]:
        cur = self.conn.execute("SELECT * FROM pepsi.stage_stats")
        names = [c.name for c in cur.description]
        return {r[0]: dict(zip(names, r, strict=True)) for r in cur.fetchall()}

    def dispatch_stats(self) -> dict[str, Any]:
        cur = self.conn.execute("SELECT * FROM pepsi.dispatch_stats")
        names = [c.name for c in cur.description]
        row = cur.fetchone()
        return dict(zip(names, row, strict=True)) if row else {}

    def set_config(self, section: str, option: str, value: str) -> None:
        self.conn.execute(
            "INSERT INTO pepsi.config (section, option, value) VALUES (%s, %s, %s)"
            " ON CONFLICT (section, option) DO UPDATE SET value = excluded.value",
            (section, option, value),
        )

    def wlog(self) -> WorkerLog:
        """The scripted workers' log, without the template probes' start and exit
        (each stage's worker handed nothing when a dispatcher starts or reloads:
        it runs nothing, so what a test counts are the workers of its messages)."""
        wlog = read_worker_log(self.worker_log)
        for pid in self.probes():
            wlog.spawns.pop(pid, None)
            wlog.exits.pop(pid, None)
            wlog.queue_max.pop(pid, None)
        return wlog

    def probes(self) -> set[int]:
        """Pids of the template probes every dispatcher of this test started."""
        return {int(pid) for d in self.dispatchers for pid in PROBE_LINE.findall(d.log())}

    # -- teardown

    def close(self) -> None:
        try:
            self.watcher.stop()
        finally:
            for d in self.dispatchers:
                try:
                    d.cleanup()
                except Exception:  # noqa: BLE001 - go on stopping the others
                    if d.running():
                        os.kill(d.pid, signal.SIGKILL)
        # Test workers that outlived everything (they must not): end them, by pid,
        # only when they are still our scripted workers.
        for pid in {
            *read_worker_log(self.worker_log).spawns,
            *(p for d in self.dispatchers for p in d.seen_workers),
        }:
            cmd = " ".join(proc_cmdline(pid))
            if pid_alive(pid) and ("scripted_worker" in cmd or "shell_worker" in cmd):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.conn.close()


@pytest.fixture(name="h")
def harness_fixture(tmp_path: Path, dsn: str) -> Iterator[Harness]:
    """The test's Harness, as fixture `h` (import harness_fixture into the test module)."""
    h = Harness(tmp_path, dsn)
    try:
        yield h
    finally:
        h.close()
