"""The peers of the side-by-side bench (``peers.py``).

Their programs and installs (graphile-worker from npm, procrastinate and PgQueuer
from PyPI, into the scratch folder), one database each on the server ``PEPSI_DSN``
points at, one timed drain per call (:class:`Peer`), the ``pgbench`` commit
floor, and the per-message cost meter (:class:`Costs`) shared with our drains.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pepsi_dispatch.devtools.bench.core import summarize_latency
from pepsi_dispatch.devtools.bench.proc import tree_cpu

GRAPHILE_VERSION = "0.17.3"
PIP_PEERS = ["procrastinate==3.10.0", "pgqueuer==1.6.0", "psycopg[binary]>=3.1"]

GRAPHILE_RUN = r"""
const { run, runMigrations, Logger } = require("graphile-worker");
const [conn, what, conc] = process.argv.slice(2);
const quiet = new Logger(() => () => {});
async function main() {
  if (what === "migrate") {
    await runMigrations({ connectionString: conn, logger: quiet });
    return;
  }
  const worker = { connectionString: conn, concurrentJobs: Number(conc) };
  if (what === "perf") {
    // https://worker.graphile.org/docs/performance: batched fetch and completion
    Object.assign(worker, { localQueue: { size: 500 } });
    Object.assign(worker, { completeJobBatchDelay: 0, failJobBatchDelay: 0 });
  }
  const taskList = {
    noop: async () => {},
    // The latency probe: records how long after payload.t0 (the enqueuer's clock
    // just before add_job) this task started, as our SDK handler does.
    lat: async (payload, helpers) => {
      const started = (performance.timeOrigin + performance.now()) / 1000;
      const row = [helpers.job.id, started - payload.t0];
      await helpers.withPgClient((c) => c.query("INSERT INTO bench_latency VALUES ($1, $2)", row));
    },
  };
  const runner = await run({ preset: { worker }, logger: quiet, taskList });
  await runner.promise;
}
main().catch((e) => { console.error(e); process.exit(1); });
"""

PROCRASTINATE_RUN = """
import sys
import procrastinate
dsn, what, arg = sys.argv[1], sys.argv[2], int(sys.argv[3])
warm = sys.argv[4:] == ["warm"]
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

@app.task(name="noop")
async def noop():
    return None

with app.open():
    if what == "schema":
        app.schema_manager.apply_schema()
    elif what == "enqueue":
        for i in range(0, arg, 5000):
            noop.batch_defer(*[{} for _ in range(min(5000, arg - i))])
    else:  # work: exit once the queue is empty; "warm": wait for jobs until stopped
        app.run_worker(concurrency=arg, wait=warm, install_signal_handlers=False)
"""

PGQUEUER_RUN = """
import asyncio, sys
import psycopg
from pgqueuer.db import PsycopgDriver
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode
dsn, what, arg = sys.argv[1], sys.argv[2], int(sys.argv[3])
warm = sys.argv[4:] == ["warm"]

async def main():
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    driver = PsycopgDriver(conn)
    if what == "schema":
        await Queries(driver).install()
    elif what == "enqueue":
        for i in range(0, arg, 5000):
            k = min(5000, arg - i)
            await Queries(driver).enqueue(["noop"] * k, [None] * k, [0] * k)
    else:  # work: batch size arg, exit once drained ("warm": wait for jobs until stopped)
        qm = QueueManager(Queries(driver))

        @qm.entrypoint("noop")
        async def noop(job):
            return None

        mode = QueueExecutionMode.continuous if warm else QueueExecutionMode.drain
        await qm.run(batch_size=arg, mode=mode)
    await conn.close()

asyncio.run(main())
"""

PGBENCH_SCRIPT = "\\set id random(1, 1000)\nUPDATE floor SET n = n + 1 WHERE id = :id;\n"


def say(text: str = "") -> None:
    print(text, flush=True)


#: Seconds an idle backend may take to report its statistics (PostgreSQL 15: 10 s).
SETTLE = 11.0


class Costs:
    """Server-wide counters around one drain: WAL, write commits, PostgreSQL CPU
    (the postmaster's process tree, when the server runs on this machine) and, when
    the pg_stat_statements extension is installed in the bench database, statement time."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.postmaster = 0
        try:
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            self.postmaster = int(stat[1])
        except (OSError, psycopg.Error):
            pass
        self.statements = bool(
            conn.execute(
                "SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'"
            ).fetchone()
        )

    def snap(self, settle: bool = False) -> dict[str, float]:
        """The counters now. ``settle``: first give the backends time to report.

        Two counters are exact at any moment: WAL bytes (the WAL insert
        position) and write transactions (the next transaction id; every
        commit that writes takes one). The cumulative statistics (WAL records
        and fsyncs in pg_stat_wal) are reported by a busy backend at most once
        a second and by an idle one within ``SETTLE`` seconds: read right after
        a fast drain they missed most of it (a drain of 20,000 jobs in 0.7 s
        read as 0 WAL bytes per job), so the closing snapshot waits first.
        """
        pg_cpu = tree_cpu(self.postmaster)[1] if self.postmaster else float("nan")
        if settle:
            time.sleep(SETTLE)
        row = self.conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0'), wal_records, wal_sync,"
            " wal_write, pg_snapshot_xmax(pg_current_snapshot())::text::numeric FROM pg_stat_wal"
        ).fetchone()
        assert row is not None
        out = {
            "wal_bytes": float(row[0]),
            "wal_records": float(row[1]),
            "fsyncs": float(row[2]),
            "wal_writes": float(row[3]),
            "commits": float(row[4]),
            "pg_cpu": pg_cpu,  # read before the wait, which is idle time
        }
        if self.statements:
            out["stmt_ms"] = float(
                self.conn.execute(
                    "SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements"
                ).fetchone()[0]  # type: ignore[index]
            )
        return out

    @staticmethod
    def per_message(a: dict[str, float], b: dict[str, float], n: int) -> dict[str, float]:
        d = {k: (b[k] - a[k]) / n for k in a}
        d["pg_cpu_us"] = d.pop("pg_cpu") * 1e6
        if "stmt_ms" in d:
            d["stmt_us"] = d.pop("stmt_ms") * 1e3
        return d


#: Per-message costs of the last drain of each system (label -> figures).
COSTS: dict[str, list[dict[str, float]]] = {}


def _dsn_for(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**{k: str(v) for k, v in params.items()})


def _url_for(dsn: str, dbname: str) -> str:
    """A postgres:// URL (node-postgres wants one) for ``dbname`` on ``dsn``'s server."""
    p = conninfo_to_dict(dsn)
    user = p.get("user") or os.environ.get("PGUSER") or os.environ.get("USER") or "postgres"
    auth = f"{user}:{p['password']}" if p.get("password") else str(user)
    host = str(p.get("host") or p.get("hostaddr") or "localhost")
    port = p.get("port") or 5432
    if host.startswith("/"):
        return f"postgresql://{auth}@localhost:{port}/{dbname}?host={host}"
    return f"postgresql://{auth}@{host}:{port}/{dbname}"


def _run(cmd: list[str], **kw: Any) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"bench: {' '.join(cmd[:3])} … failed:\n{r.stdout}{r.stderr}")


def install(folder: Path) -> dict[str, bool]:
    """Install the peers into ``folder`` (once); returns which are usable."""
    folder.mkdir(parents=True, exist_ok=True)
    have: dict[str, bool] = {}
    gw = folder / "node_modules" / "graphile-worker"
    if not gw.exists():
        if shutil.which("npm") and shutil.which("node"):
            say(f"installing graphile-worker {GRAPHILE_VERSION} into {folder} (npm)")
            _run(["npm", "install", "--prefix", str(folder), f"graphile-worker@{GRAPHILE_VERSION}"])
        else:
            say("graphile-worker skipped: node/npm not found (Debian: apt-get install nodejs npm)")
    have["graphile"] = gw.exists()
    venv = folder / "venv"
    if not (venv / "bin" / "python").exists() or not (venv / ".installed").exists():
        say(f"installing {', '.join(PIP_PEERS[:2])} into {venv} (pip)")
        _run([sys.executable, "-m", "venv", str(venv)])
        _run([str(venv / "bin" / "pip"), "install", "-q", *PIP_PEERS])
        (venv / ".installed").touch()
    have["procrastinate"] = have["pgqueuer"] = True
    (folder / "graphile_run.js").write_text(GRAPHILE_RUN)
    (folder / "procrastinate_run.py").write_text(PROCRASTINATE_RUN)
    (folder / "pgqueuer_run.py").write_text(PGQUEUER_RUN)
    return have


def _ensure_db(admin: psycopg.Connection, name: str) -> None:
    if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
        admin.execute(f'CREATE DATABASE "{name}"')


class Peer:
    """One peer system: schema set-up, enqueue, a service command, and 'anything left?'."""

    def __init__(
        self,
        name: str,
        dsn: str,
        prepare: Callable[[], None],
        enqueue: Callable[[int], None],
        command: list[str],
        left_sql: str,
        clean_sql: str,
    ) -> None:
        self.name, self.dsn, self.prepare, self.enqueue = name, dsn, prepare, enqueue
        self.command, self.left_sql, self.clean_sql = command, left_sql, clean_sql

    def drain(self, n: int, timeout: float, costs: Costs | None = None, warm: bool = True) -> float:
        """Jobs per second of one drain of ``n`` jobs.

        ``warm``: the service is started on an empty queue and left to settle
        (:func:`wait_idle`); the clock runs from the moment the backlog has been
        enqueued to the last job done. Otherwise (cold) the backlog is enqueued
        first and the clock runs from the service's start, start-up included.
        """
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(self.clean_sql)
            if not warm:
                self.enqueue(n)
            conn.execute("VACUUM ANALYZE")
            c0 = costs.snap() if costs and not warm else {}
            t0 = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
            proc = subprocess.Popen(
                self.command + (["warm"] if warm else []),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            deadline = time.monotonic() + timeout
            try:
                cpu0 = 0.0
                if warm:
                    (_, cpu0), t0, c0, _ = backlog_arrives(
                        conn, proc, self.name, lambda: self.enqueue(n), costs
                    )
                while conn.execute(self.left_sql).fetchone()[0]:  # type: ignore[index]
                    if proc.poll() is not None and proc.returncode != 0:
                        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                        raise SystemExit(f"bench: {self.name} exited {proc.returncode}: {err}")
                    if time.monotonic() > deadline:
                        raise SystemExit(f"bench: {self.name} not drained after {timeout} s")
                    time.sleep(0.005)
                t1 = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
                if costs:
                    own, tree = tree_cpu(proc.pid)
                    per = Costs.per_message(c0, costs.snap(settle=True), n)
                    per["service_cpu_us"] = (tree - cpu0) / n * 1e6
                    COSTS.setdefault(self.name, []).append(per)
            finally:
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(20)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
        return n / (t1 - t0).total_seconds()


class Arrival(NamedTuple):
    """The moment a backlog arrived at a running service (see :func:`backlog_arrives`)."""

    #: (own, whole tree) CPU seconds of the service's process before the backlog
    cpu: tuple[float, float]
    #: the database clock right after the backlog's commit: the drain's clock starts
    t0: Any
    #: the cost counters then ({} without a meter)
    counters: dict[str, float]
    #: what the enqueue returned
    enqueued: Any


def backlog_arrives(
    conn: psycopg.Connection,
    proc: subprocess.Popen[Any],
    name: str,
    enqueue: Callable[[], Any],
    costs: Costs | None,
) -> Arrival:
    """Wait until the service ``proc`` is idle, then enqueue the backlog and read
    the clock and the counters right after its commit."""
    wait_idle(proc, name)
    cpu = tree_cpu(proc.pid)
    enqueued = enqueue()
    t0 = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
    return Arrival(cpu, t0, costs.snap() if costs else {}, enqueued)


def wait_idle(
    proc: subprocess.Popen[Any], name: str, quiet: float = 0.3, timeout: float = 60
) -> None:
    """Return once ``proc`` runs and its process tree has used no CPU for ``quiet``
    seconds: the service has started and waits for work. Raise if it exits first."""
    start = time.monotonic()
    last, since = tree_cpu(proc.pid)[1], start
    while True:
        time.sleep(0.05)
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise SystemExit(f"bench: {name} exited {proc.returncode} while starting: {err}")
        now, cpu = time.monotonic(), tree_cpu(proc.pid)[1]
        if cpu != last:
            last, since = cpu, now
        elif now - since >= quiet and now - start >= 2 * quiet:
            return
        if now - start > timeout:
            raise SystemExit(f"bench: {name} still busy {timeout:.0f} s after its start")


def peers(dsn: str, folder: Path, have: dict[str, bool]) -> dict[str, Peer]:
    """The peer configurations to run: name -> Peer."""
    out: dict[str, Peer] = {}
    with psycopg.connect(dsn, autocommit=True) as admin:
        for db in ("pepsi_peer_graphile", "pepsi_peer_procrastinate", "pepsi_peer_pgqueuer"):
            _ensure_db(admin, db)
    if have.get("graphile"):
        out.update(_graphile(dsn, folder))
    py = str(folder / "venv" / "bin" / "python")
    if have.get("procrastinate"):
        out.update(_procrastinate(dsn, folder, py))
    if have.get("pgqueuer"):
        out.update(_pgqueuer(dsn, folder, py))
    return out


def _graphile(dsn: str, folder: Path) -> dict[str, Peer]:
    """graphile-worker at its default and its perf preset."""
    out: dict[str, Peer] = {}
    gdsn = _dsn_for(dsn, "pepsi_peer_graphile")
    url = _url_for(dsn, "pepsi_peer_graphile")
    js = str(folder / "graphile_run.js")
    env_node = ["node", js, url]
    subprocess.run([*env_node, "migrate"], check=True, cwd=folder)

    def g_enqueue(n: int, gdsn: str = gdsn) -> None:
        with psycopg.connect(gdsn, autocommit=True) as c:
            c.execute(
                "SELECT graphile_worker.add_jobs(array(SELECT ROW('noop', '{}'::json,"
                " NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec"
                " FROM generate_series(1, %s)))",
                (n,),
            )

    left = "SELECT EXISTS (SELECT 1 FROM graphile_worker._private_jobs)"
    clean = "DELETE FROM graphile_worker._private_jobs"
    for label, what in (("default", "default"), ("perf preset", "perf")):
        out[f"graphile-worker {GRAPHILE_VERSION}, {label}, concurrency 8"] = Peer(
            f"graphile-worker {label}",
            gdsn,
            lambda: None,
            g_enqueue,
            [*env_node, what, "8"],
            left,
            clean,
        )
    return out


def graphile_latency(dsn: str, folder: Path, count: int, timeout: float) -> dict[str, float]:
    """graphile-worker's enqueue→task-start latency, measured as ours is
    (``core.latency``): an idle worker at its default preset (concurrency 8),
    ``count`` sequential ``add_job`` calls, each timed by a task that records
    its own start against the enqueuer's clock. Seconds; ``cold`` is the first
    job's (the worker starting). Needs ``install`` to have found node."""
    folder = folder.resolve()
    with psycopg.connect(dsn, autocommit=True) as admin:
        _ensure_db(admin, "pepsi_peer_graphile")
    gdsn = _dsn_for(dsn, "pepsi_peer_graphile")
    node = ["node", str(folder / "graphile_run.js"), _url_for(dsn, "pepsi_peer_graphile")]
    subprocess.run([*node, "migrate"], check=True, cwd=folder)
    samples: list[float] = []
    enqueues: list[float] = []
    cold = 0.0
    with psycopg.connect(gdsn, autocommit=True) as conn:
        conn.execute("DELETE FROM graphile_worker._private_jobs")
        conn.execute("DROP TABLE IF EXISTS bench_latency")
        conn.execute("CREATE TABLE bench_latency (job_id bigint PRIMARY KEY, latency float8)")
        proc = subprocess.Popen([*node, "default", "8"], cwd=folder)
        try:
            for i in range(count + 1):
                t0 = time.time()
                (job,) = conn.execute(  # type: ignore[misc]
                    "SELECT (graphile_worker.add_job('lat',"
                    " json_build_object('t0', %s::float8))).id",
                    (t0,),
                ).fetchone()
                if i:
                    enqueues.append(time.time() - t0)
                deadline = time.monotonic() + timeout
                while True:
                    time.sleep(0.01)  # sparse polling, as for ours (2 cores)
                    row = conn.execute(
                        "SELECT latency FROM bench_latency WHERE job_id = %s", (job,)
                    ).fetchone()
                    if row:
                        break
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise SystemExit(f"bench: graphile latency job {job} not started")
                if i == 0:
                    cold = float(row[0])
                else:
                    samples.append(float(row[0]))
                time.sleep(0.01)  # let the worker go idle again
        finally:
            proc.terminate()
            proc.wait(30)
    return summarize_latency(samples, enqueues, cold)


def _python_peer(
    dsn: str,
    folder: Path,
    py: str,
    system: str,
    settings: tuple[tuple[str, int], ...],
    sql: tuple[str, str, str],
) -> dict[str, Peer]:
    """A Python peer driven by ``{system}_run.py DSN schema|enqueue N|work ARG``
    in its own database: ``settings`` are (table key, ARG); ``sql`` is
    (the table whose presence means the schema is there, "anything left?", clean)."""
    out: dict[str, Peer] = {}
    pdsn = _dsn_for(dsn, f"pepsi_peer_{system}")
    script = str(folder / f"{system}_run.py")
    table, left_sql, clean_sql = sql
    with psycopg.connect(pdsn, autocommit=True) as c:
        if not c.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0]:  # type: ignore[index]
            subprocess.run([py, script, pdsn, "schema", "0"], check=True)

    def enqueue(n: int, pdsn: str = pdsn, script: str = script) -> None:
        subprocess.run([py, script, pdsn, "enqueue", str(n)], check=True)

    for key, arg in settings:
        # "procrastinate 3.10, concurrency 8" -> "procrastinate concurrency 8"
        out[key] = Peer(
            f"{key.split(' ', 1)[0]} {key.split(', ', 1)[1]}",
            pdsn,
            lambda: None,
            enqueue,
            [py, script, pdsn, "work", str(arg)],
            left_sql,
            clean_sql,
        )
    return out


def _procrastinate(dsn: str, folder: Path, py: str) -> dict[str, Peer]:
    """procrastinate at concurrency 1 (its default) and 8."""
    return _python_peer(
        dsn,
        folder,
        py,
        "procrastinate",
        (
            ("procrastinate 3.10, default (concurrency 1)", 1),
            ("procrastinate 3.10, concurrency 8", 8),
        ),
        (
            "procrastinate_jobs",
            "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))",
            "TRUNCATE procrastinate_jobs CASCADE",
        ),
    )


def _pgqueuer(dsn: str, folder: Path, py: str) -> dict[str, Peer]:
    """PgQueuer at batch size 10 (its default) and 100."""
    return _python_peer(
        dsn,
        folder,
        py,
        "pgqueuer",
        (
            ("PgQueuer 1.6, default (batch 10)", 10),
            ("PgQueuer 1.6, batch 100", 100),
        ),
        ("pgqueuer", "SELECT EXISTS (SELECT 1 FROM pgqueuer)", "TRUNCATE pgqueuer, pgqueuer_log"),
    )


def pgbench_floor(dsn: str, clients: int = 8, seconds: int = 5) -> float:
    """Transactions/s of one-row-update commits (the commit floor of the box)."""
    fdsn = _dsn_for(dsn, "pepsi_peer_pgbench")
    with psycopg.connect(dsn, autocommit=True) as admin:
        _ensure_db(admin, "pepsi_peer_pgbench")
    with psycopg.connect(fdsn, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS floor (id int PRIMARY KEY, n bigint NOT NULL)")
        c.execute(
            "INSERT INTO floor SELECT g, 0 FROM generate_series(1, 1000) g ON CONFLICT DO NOTHING"
        )
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(PGBENCH_SCRIPT)
    try:
        r = subprocess.run(
            ["pgbench", "-n", "-c", str(clients), "-j", "2", "-T", str(seconds)]
            + ["-f", f.name, fdsn],
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        os.unlink(f.name)
    m = re.search(r"tps = ([0-9.]+) \(without initial", r.stdout) or re.search(
        r"tps = ([0-9.]+)", r.stdout
    )
    if not m:
        raise SystemExit(f"bench: cannot read pgbench's tps:\n{r.stdout}{r.stderr}")
    return float(m.group(1))
