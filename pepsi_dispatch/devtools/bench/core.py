"""Built-in benchmark: `make bench` / `python -m pepsi_dispatch.devtools.bench`.

Throughput: an N-stage no-op pipeline (bench_s1 -> bench_s2 -> ... ), M messages
enqueued up front with ``enqueue_many`` (then ANALYZE), timed from the start of
the dispatcher to the last row done (database clock; worker start-up included).
``--live`` instead enqueues into a running dispatcher and times from the first
enqueue. Reported: messages/s and stage runs/s. Stage programs:

* ``sdk-default``  handlers written with :mod:`pepsi_dispatch.worker`, ``run(handlers)``
              as first documented (group commit, the in-hand slot, a template)
* ``sdk``     the same with ``group_commit=False``: one commit per message
* ``sdk-gc``  the same with ``group_commit=True`` (one commit per batch of buffered ids)
* ``raw``     a minimal protocol worker: every batch of buffered ids moved with ONE
              statement and answered at once (the dispatcher's ceiling)

Latency: an idle dispatcher and a one-stage pipeline; messages enqueued one at a
time (the next after the previous is done); the SDK handler records how long
after the enqueue call it started. Reported: p50/p95/p99/max (the first, cold
message — worker start — is reported apart).

Needs ``PEPSI_DSN`` (a database migrated to head). Rows of the bench_* stages are
deleted before each run; stats are reported as deltas.
"""

from __future__ import annotations

import os
import platform
import pwd
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pepsi_dispatch.devtools.bench import funcstats, recycling
from pepsi_dispatch.devtools.bench.recycling import EVENTS_HOOK
from pepsi_dispatch.devtools.demo import dispatcher_command
from pepsi_dispatch.enqueue import enqueue_many

SDK_WORKER = """#!{python}
import os, sys, time
from pepsi_dispatch.worker import run

def noop(msg):
    return None  # advance to the only successor, or finish the last stage

def latency(msg):
    msg.state["latency"] = time.time() - msg.payload["t0"]
    return None

stages = os.environ["PEPSI_BENCH_STAGES"].split(",")
handlers = {{s: noop for s in stages}}
if os.environ.get("PEPSI_BENCH_LATENCY"):
    handlers = {{s: latency for s in stages}}
{events_hook}
run(handlers{group_commit})
"""

RAW_WORKER = """#!{python}
# Minimal protocol worker: all ids buffered on stdin moved with one statement.
import os, select, sys
import psycopg

stage = os.environ["PEPSI_STAGE"]
stages = os.environ["PEPSI_BENCH_STAGES"].split(",")
did = int(os.environ["PEPSI_DISPATCHER_ID"])
i = stages.index(stage)
nxt = stages[i + 1] if i + 1 < len(stages) else None
conn = psycopg.connect(os.environ["PEPSI_DSN"], autocommit=True)
if nxt:
    sql = "SELECT count(*) FILTER (WHERE pepsi.advance(x, %s, %s, %s)) FROM unnest(%s::bigint[]) x"
else:
    sql = "SELECT count(*) FILTER (WHERE pepsi.finish(x, %s, %s)) FROM unnest(%s::bigint[]) x"
fd = sys.stdin.fileno()
buf = b""
while True:
    chunk = os.read(fd, 65536)
    if not chunk:
        break
    buf += chunk
    if b"\\n" not in buf:
        continue
    head, _, buf = buf.rpartition(b"\\n")
    ids = [int(x) for x in head.split()]
    # one statement in autocommit is atomic on its own: one round trip, one commit
    # (an explicit transaction around it would add BEGIN and COMMIT round trips)
    if nxt:
        conn.execute(sql, (stage, nxt, did, ids))
    else:
        conn.execute(sql, (stage, did, ids))
    os.write(1, b"0\\n" * len(ids))
"""

RAW_FORK_WORKER = """#!{python}
# The minimal protocol worker above, started by fork from a template after its imports.
import os, select, sys
import psycopg
from pepsi_dispatch.worker import connect, fork_point, leave

fork_point()

stage = os.environ["PEPSI_STAGE"]
stages = os.environ["PEPSI_BENCH_STAGES"].split(",")
did = int(os.environ["PEPSI_DISPATCHER_ID"])
i = stages.index(stage)
nxt = stages[i + 1] if i + 1 < len(stages) else None
conn = connect()  # a session passed on by the stage's last worker, when one waits
if nxt:
    sql = "SELECT count(*) FILTER (WHERE pepsi.advance(x, %s, %s, %s)) FROM unnest(%s::bigint[]) x"
else:
    sql = "SELECT count(*) FILTER (WHERE pepsi.finish(x, %s, %s)) FROM unnest(%s::bigint[]) x"
fd = sys.stdin.fileno()
buf = b""
while True:
    chunk = os.read(fd, 65536)
    if not chunk:
        break
    buf += chunk
    if b"\\n" not in buf:
        continue
    head, _, buf = buf.rpartition(b"\\n")
    ids = [int(x) for x in head.split()]
    # one statement in autocommit is atomic on its own: one round trip, one commit
    # (an explicit transaction around it would add BEGIN and COMMIT round trips)
    if nxt:
        conn.execute(sql, (stage, nxt, did, ids))
    else:
        conn.execute(sql, (stage, did, ids))
    os.write(1, b"0\\n" * len(ids))
leave(0, conn)  # gives the session back; no interpreter teardown (see WORKERS.md)
"""


def say(text: str = "") -> None:
    print(text, flush=True)


def machine_facts(conn: psycopg.Connection) -> None:
    """Print what the numbers depend on."""
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    settings = {
        name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
        for name in ("server_version", "synchronous_commit", "fsync", "shared_buffers")
    }
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    say(
        f"machine: load average {load}, {os.cpu_count()} CPUs ({cpu}),"
        f" Python {platform.python_version()},"
        f" PostgreSQL {settings['server_version']}"
        f" (synchronous_commit={settings['synchronous_commit']}, fsync={settings['fsync']},"
        f" shared_buffers={settings['shared_buffers']})"
    )


class Setup:
    """Config file and stage programs of one bench run, in a temporary directory."""

    def __init__(
        self,
        workdir: Path,
        stages: list[str],
        parallelism: int,
        queue_limit: int,
        worker: str,
        max_messages: int = 1_000_000,
        competing: bool = False,
    ) -> None:
        self.dir = workdir
        self.stages = stages
        python = sys.executable
        programs = {
            "sdk-default": SDK_WORKER.format(
                python=python, group_commit="", events_hook=EVENTS_HOOK
            ),
            "sdk": SDK_WORKER.format(
                python=python, group_commit=", group_commit=False", events_hook=EVENTS_HOOK
            ),
            "sdk-gc": SDK_WORKER.format(
                python=python, group_commit=", group_commit=True", events_hook=EVENTS_HOOK
            ),
            "raw": RAW_WORKER.format(python=python),
            "raw-fork": RAW_FORK_WORKER.format(python=python),
        }
        self.program = workdir / f"noop-{worker}.py"
        self.program.write_text(programs[worker])
        self.program.chmod(0o755)
        self.conf = workdir / "pepsi.conf"
        lines = [
            "[pepsi-dispatch]",
            f"CONFIG_FILE = {self.conf}",
            f"SERVICE_USER = {pwd.getpwuid(os.getuid()).pw_name}",
            "WORKER_IDLE_TIMEOUT = 60 s",
            "STATS_INTERVAL = 1 s",
            "POLL_INTERVAL = 5 s",
            "RETENTION = 0",
            *(["COMPETING = YES"] if competing else []),
            "",
        ]
        for i, stage in enumerate(stages):
            lines += [
                f"[stage-{stage}]",
                f"PROGRAM = {self.program}",
                f"NEXT = {stages[i + 1] if i + 1 < len(stages) else ''}",
                f"PARALLELISM = {parallelism}",
                f"QUEUE_LIMIT = {queue_limit}",
                f"MAX_MESSAGES = {max_messages}",
                "",
            ]
        self.conf.write_text("\n".join(lines))

    def env(self, dsn: str, latency: bool = False) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("PEPSI_CONFIG", None)
        env["PEPSI_DSN"] = dsn
        env["PEPSI_BENCH_STAGES"] = ",".join(self.stages)
        if latency:
            env["PEPSI_BENCH_LATENCY"] = "1"
        return env


def clean(conn: psycopg.Connection) -> None:
    conn.execute("DELETE FROM pepsi.workqueue WHERE stage LIKE 'bench\\_%'")
    try:
        conn.execute("VACUUM ANALYZE pepsi.workqueue")
    except psycopg.Error:
        pass  # not the owner: fine, just less repeatable


def start(
    setup: Setup, env: dict[str, str], log: Path, level: str = "WARNING"
) -> subprocess.Popen[bytes]:
    cmd = [*dispatcher_command(), "-c", str(setup.conf), "-L", level, "-l", str(log), "serve"]
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    time.sleep(0.5)
    if proc.poll() is not None:
        raise SystemExit(f"bench: the dispatcher exited with {proc.returncode}: {log.read_text()}")
    return proc


def stop(proc: subprocess.Popen[bytes]) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None
    return proc.returncode


def _dispatch_stats(conn: psycopg.Connection) -> tuple[int, int]:
    row = conn.execute("SELECT stage_runs, messages FROM pepsi.dispatch_stats").fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


#: Is any row of the run not yet in a final state? Only the partial indexes of the
#: unfinished states are read (pending by stage and id, running, paused), so the
#: poll costs the same whatever the number of rows already done. (It was a
#: count(*) over the id range: 46 ms per call at 20,000 rows, every 0.2 s, on
#: the server being measured.)
SQL_UNFINISHED = (
    "SELECT EXISTS (SELECT 1 FROM pepsi.workqueue WHERE status = 'pending'"
    "   AND stage = ANY(%(stages)s) AND workqueue_id BETWEEN %(first)s AND %(last)s)"
    " OR EXISTS (SELECT 1 FROM pepsi.workqueue WHERE status = 'running'"
    "   AND workqueue_id BETWEEN %(first)s AND %(last)s)"
    " OR EXISTS (SELECT 1 FROM pepsi.workqueue WHERE status = 'paused'"
    "   AND workqueue_id BETWEEN %(first)s AND %(last)s)"
)


def _unfinished(conn: psycopg.Connection, stages: list[str], first: int, last: int) -> bool:
    row = conn.execute(SQL_UNFINISHED, {"stages": stages, "first": first, "last": last})
    return bool(row.fetchone()[0])  # type: ignore[index]


#: Seconds without one stage run finished after which a drain gives up (its
#: workers cannot start, say), instead of waiting for the whole --timeout.
STALL_AFTER = 60.0


class Stall:
    """Notices a drain that has stopped moving: no stage run counted in the
    statistics (flushed every STATS_INTERVAL, 1 s here) for ``after`` seconds.
    It reads them at most once a second (a poll must not cost the server much
    of what it measures)."""

    def __init__(self, conn: psycopg.Connection, after: float) -> None:
        self.conn = conn
        self.after = after
        self.runs = _dispatch_stats(conn)[0]
        self.since = self.looked = time.monotonic()

    def check(self, logs: list[Path]) -> None:
        """Raise SystemExit, with the end of each dispatcher log, once stalled."""
        now = time.monotonic()
        if now - self.looked < 1.0:
            return
        self.looked = now
        runs = _dispatch_stats(self.conn)[0]
        if runs != self.runs:
            self.runs, self.since = runs, now
            return
        if now - self.since < self.after:
            return
        tails = "\n".join(f"--- {log} (last lines):\n" + "\n".join(_tail(log, 15)) for log in logs)
        raise SystemExit(
            f"bench: no stage run finished in {self.after:.0f} s; the workers may not"
            f" start (try the worker program by hand):\n{tails}"
        )


def _tail(log: Path, n: int) -> list[str]:
    try:
        return log.read_text(errors="replace").splitlines()[-n:]
    except OSError as exc:
        return [f"(unreadable: {exc})"]


def throughput(
    dsn: str,
    worker: str,
    messages: int,
    n_stages: int,
    parallelism: int,
    queue_limit: int,
    timeout: float,
    live: bool = False,
    max_messages: int = 1_000_000,
    replicas: int = 0,
    costs: bool = False,
) -> dict[str, Any]:
    """One throughput run; returns its numbers.

    ``costs`` (an SDK worker): the run's recycling counts and CPU as well,
    under ``"drain"`` (a :class:`.recycling.Drain`; the dispatcher logs at INFO).

    ``replicas`` > 0: that many competing dispatchers (``COMPETING = YES``) share
    the stages, each with ``parallelism // replicas`` workers per stage, so the
    total is the same as one dispatcher's; 0: one dispatcher, not competing.

    Default: the messages are enqueued and the table ANALYZEd before the dispatcher
    starts; the clock runs from its start to the last row done. ``live``: the
    dispatcher is already running (and claiming) while the messages go in, with
    the planner statistics of the (nearly empty) table before the run; the clock
    runs from the first enqueue.
    """
    stages = [f"bench_s{i + 1}" for i in range(n_stages)]
    with (
        tempfile.TemporaryDirectory(prefix="pepsi-bench-") as tmp,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        per_replica = max(1, parallelism // replicas) if replicas else parallelism
        setup = Setup(
            Path(tmp), stages, per_replica, queue_limit, worker, max_messages, replicas > 0
        )
        clean(conn)
        runs0, msgs0 = _dispatch_stats(conn)
        logs = [Path(tmp) / f"dispatcher-{i}.log" for i in range(max(1, replicas))]
        env = setup.env(dsn)
        level = "WARNING"
        events = Path(tmp) / "events"
        if costs:
            env[recycling.EVENTS_ENV] = str(events)
            level = "INFO"  # the recycles are counted in the log
            postmaster = recycling.postmaster(conn)
            sessions0 = recycling.sessions(conn)
            pg0 = recycling.pg_cpu(postmaster)

        functions0 = funcstats.snapshot(conn) if funcstats.tracking(conn) else None

        def clock() -> Any:
            return conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]

        procs: list[subprocess.Popen[bytes]] = []
        if live:
            procs = [start(setup, env, one, level) for one in logs]
            t_start = clock()
        else:
            t0 = clock()
        try:
            ids = enqueue_many(conn, stages[0], ({"n": i} for i in range(messages)))
            t_enq = clock()
            if not live:
                conn.execute("ANALYZE pepsi.workqueue")
                t_start = clock()
                procs = [start(setup, env, one, level) for one in logs]
            first, last = ids[0], ids[-1]
            deadline = time.monotonic() + timeout
            stall = Stall(conn, min(timeout, STALL_AFTER))
            while True:
                time.sleep(0.2)
                if not _unfinished(conn, stages, first, last):
                    if costs:
                        drained_at = time.time()
                        trees = [recycling.tree_cpu(proc.pid) for proc in procs]
                        pg1 = recycling.pg_cpu(postmaster)
                        noted = recycling.read_events(
                            events.read_text() if events.exists() else "", drained_at
                        )
                        templates = sum(map(recycling.own_and_reaped_cpu, noted.templates))
                    break
                for proc, one in zip(procs, logs, strict=True):
                    if proc.poll() is not None:
                        raise SystemExit(f"bench: dispatcher died ({proc.returncode}); log {one}")
                stall.check(logs)
                if time.monotonic() > deadline:
                    left = conn.execute(
                        "SELECT count(*) FROM pepsi.workqueue WHERE workqueue_id BETWEEN %s AND %s"
                        " AND status NOT IN ('done', 'failed', 'timeout', 'expired')",
                        (first, last),
                    ).fetchone()[0]  # type: ignore[index]
                    raise SystemExit(f"bench: {left} messages left after {timeout} s")
            t_end, failed = conn.execute(
                "SELECT max(updated_at), count(*) FILTER (WHERE status <> 'done')"
                " FROM pepsi.workqueue WHERE workqueue_id BETWEEN %s AND %s",
                (first, last),
            ).fetchone()  # type: ignore[misc]
        finally:
            codes = [stop(proc) for proc in procs] or [-1]
        rc = next((c for c in codes if c != 0), 0) if procs else -1
        runs1, msgs1 = _dispatch_stats(conn)
        elapsed = (t_end - t_start).total_seconds()
        extra: dict[str, Any] = {}
        gone = _backends_gone(conn) if costs or functions0 is not None else True
        if functions0 is not None:
            # once the drain's sessions are gone, their statistics are in
            extra["functions"] = funcstats.delta(functions0, funcstats.snapshot(conn))
            extra["functions_partial"] = not gone
        if costs:
            extra["drain"] = recycling.Drain(
                recycles=sum(recycling.count_recycles(one.read_text()) for one in logs),
                events=noted,
                service_cpu=sum(tree for _, tree in trees),
                dispatcher_cpu=sum(own for own, _ in trees),
                pg_cpu=pg1 - pg0,
                sessions=recycling.sessions(conn) - sessions0,
                template_cpu=templates,
            )
        return {
            **extra,
            "elapsed": elapsed,
            "enqueue": (t_enq - (t_start if live else t0)).total_seconds(),
            "msg_per_s": messages / elapsed,
            "runs_per_s": (runs1 - runs0) / elapsed,
            "stage_runs": runs1 - runs0,
            "handed": msgs1 - msgs0,
            "failed": failed,
            "exit": -1 if rc is None else rc,
        }


def _backends_gone(conn: psycopg.Connection, timeout: float = 10.0) -> bool:
    """Wait until no other client session is on this database (the stopped
    dispatcher's workers and templates have ended: their statistics, such as
    pg_stat_database.sessions, are in); False if some are still there after
    ``timeout`` seconds (another client of the database, say)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        ).fetchone()
        if row is not None and row[0] == 0:
            return True
        time.sleep(0.1)
    return False


def summarize_latency(samples: list[float], enqueues: list[float], cold: float) -> dict[str, float]:
    """Percentiles of a latency run (seconds). ``samples[i]`` runs from just before
    enqueue call i to the handler's start, ``enqueues[i]`` is that call's own round
    trip (its commit included); ``after_commit_*``: their differences, from the
    commit returned to the handler's start."""
    after = sorted(s - e for s, e in zip(samples, enqueues, strict=True))
    samples, enqueues = sorted(samples), sorted(enqueues)

    def pct(p: float, of: list[float]) -> float:
        return of[min(len(of) - 1, int(round(p / 100 * (len(of) - 1))))]

    return {
        "enqueue_p50": pct(50, enqueues),
        "enqueue_p99": pct(99, enqueues),
        "after_commit_p50": pct(50, after),
        "after_commit_p99": pct(99, after),
        "cold": cold,
        "p50": pct(50, samples),
        "p95": pct(95, samples),
        "p99": pct(99, samples),
        "max": samples[-1],
        "mean": statistics.fmean(samples),
        "n": len(samples),
    }


def latency(dsn: str, count: int, timeout: float) -> dict[str, float]:
    """Sequential enqueue→handler-start latency with an idle dispatcher (seconds)."""
    stages = ["bench_lat"]
    with (
        tempfile.TemporaryDirectory(prefix="pepsi-bench-") as tmp,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        setup = Setup(Path(tmp), stages, 1, 1, "sdk-default")
        clean(conn)
        log = Path(tmp) / "dispatcher.log"
        proc = start(setup, setup.env(dsn, latency=True), log)
        samples: list[float] = []
        #: the enqueue's own round trip (its commit included): the part of each
        #: sample no dispatcher can shorten, measured on the same box and gaps
        enqueues: list[float] = []
        cold = 0.0
        try:
            for i in range(count + 1):
                t0 = time.time()
                mid = conn.execute(
                    "SELECT pepsi.enqueue('bench_lat', %s)", (Jsonb({"t0": t0}),)
                ).fetchone()[0]  # type: ignore[index]
                if i:
                    enqueues.append(time.time() - t0)
                deadline = time.monotonic() + timeout
                while True:
                    # The handler measures its own start; this process only waits
                    # for it. Polling sparsely keeps it from competing for the CPU
                    # with the path being measured (2 cores here).
                    time.sleep(0.01)
                    row = conn.execute(
                        "SELECT status, state->'latency' FROM pepsi.workqueue"
                        " WHERE workqueue_id = %s",
                        (mid,),
                    ).fetchone()
                    if row and row[0] == "done":
                        break
                    if time.monotonic() > deadline:
                        raise SystemExit(f"bench: latency message {mid} not done after {timeout}s")
                if i == 0:
                    cold = float(row[1])
                else:
                    samples.append(float(row[1]))
                time.sleep(0.01)  # let the dispatcher go idle again
        finally:
            stop(proc)
    return summarize_latency(samples, enqueues, cold)
