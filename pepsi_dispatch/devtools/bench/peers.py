"""Side-by-side bench against peer PostgreSQL job queues: ``make bench BENCH_ARGS=--peers``.

Installs graphile-worker (npm), procrastinate and PgQueuer (pip, a venv of their
own) into a scratch folder (``--peers-dir``, default ``.bench-peers/``, ignored by
git), gives each peer a database of its own on the server ``PEPSI_DSN`` points at,
and runs no-op drains of the same job count, interleaved round by round with ours:

* each system at its defaults and at its documented fastest settings;
* every drain: the jobs are inserted first (not timed), then the clock runs from
  the start of the service's process(es) to the last job done (start-up included,
  as in ``make bench``), read on the database clock;
* the ``pgbench`` commit floor of the box in the same run: one-row-update
  transactions with 8 clients, fsync and synchronous_commit as the server has them.

It prints one table: median, min–max of ``--runs`` rounds, and ratios to the
graphile-worker perf preset and to the pgbench floor. No network is needed
beyond the package registries (npm, PyPI) for the first install.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from pepsi_dispatch.config.model import StageConfig
from pepsi_dispatch.devtools.bench import core as bench
from pepsi_dispatch.devtools.bench.floor import floor
from pepsi_dispatch.devtools.bench.peer_drivers import (
    COSTS,
    GRAPHILE_VERSION,
    Costs,
    backlog_arrives,
    install,
    peers,
    pgbench_floor,
    say,
)
from pepsi_dispatch.devtools.bench.proc import tree_cpu

SDK_DEFAULT_WORKER = """#!{python}
import os
from pepsi_dispatch.worker import run
stages = os.environ["PEPSI_BENCH_STAGES"].split(",")
run({{s: (lambda msg: None) for s in stages}})
"""

FINISH_MANY_WORKER = """#!{python}
# A batch worker: all ids buffered on stdin finished with one pepsi.finish_many.
import os
import psycopg

stage = os.environ["PEPSI_STAGE"]
did = int(os.environ["PEPSI_DISPATCHER_ID"])
conn = psycopg.connect(
    os.environ["PEPSI_DSN"], autocommit=True, application_name="pepsi-worker " + stage
)
fd = 0
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
    done = {{r[0] for r in conn.execute(
        "SELECT * FROM pepsi.finish_many(%s, %s, %s)", (ids, stage, did)
    )}}
    os.write(1, b"".join(b"0\\n" if i in done else b"1 not running here\\n" for i in ids))
"""


def ours(
    dsn: str,
    worker: str,
    n: int,
    parallelism: int,
    options: dict[str, str | None],
    timeout: float,
    label: str = "",
    costs: Costs | None = None,
    warm: bool = True,
) -> float:
    """One pepsi-dispatch drain (1 stage); ``options`` replace the stage's bench settings
    (a value of None drops the option: the shipped default applies). ``warm``: the
    clock runs from the backlog's arrival at a dispatcher already serving (and idle:
    no worker runs yet, unless MIN_WORKERS keeps some started: then it waits until
    they are connected); otherwise from the dispatcher's start, the backlog waiting."""
    stages = ["bench_s1"]
    with (
        tempfile.TemporaryDirectory(prefix="pepsi-bench-") as tmp,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        setup = _setup(Path(tmp), stages, worker, parallelism, options)
        bench.clean(conn)
        if not warm:
            ids = bench.enqueue_many(conn, stages[0], ({"n": i} for i in range(n)))
        conn.execute("ANALYZE pepsi.workqueue")
        c0 = costs.snap() if costs and not warm else {}
        t0 = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
        proc = bench.start(setup, setup.env(dsn), Path(tmp) / "dispatcher.log")
        try:
            own0 = cpu0 = 0.0
            if warm:

                def enqueue() -> list[int]:
                    with conn.transaction():  # the whole backlog arrives at one commit
                        return bench.enqueue_many(conn, stages[0], ({"n": i} for i in range(n)))

                _wait_warm(conn, proc, stages[0], int(options.get("MIN_WORKERS") or 0), timeout)
                (own0, cpu0), t0, c0, ids = backlog_arrives(
                    conn, proc, "pepsi-dispatch", enqueue, costs
                )
            _wait_drained(conn, proc, stages[0], timeout, Path(tmp) / "dispatcher.log")
            t1, bad = conn.execute(
                "SELECT max(updated_at), count(*) FILTER (WHERE status <> 'done')"
                " FROM pepsi.workqueue WHERE workqueue_id BETWEEN %s AND %s",
                (ids[0], ids[-1]),
            ).fetchone()  # type: ignore[misc]
            if costs:
                own, tree = tree_cpu(proc.pid)
                per = Costs.per_message(c0, costs.snap(settle=True), n)
                per["dispatcher_cpu_us"] = (own - own0) / n * 1e6
                per["service_cpu_us"] = (tree - cpu0) / n * 1e6
                COSTS.setdefault(label, []).append(per)
        finally:
            bench.stop(proc)
        if bad:
            raise SystemExit(f"bench: {bad} of our messages did not end done")
    return n / (t1 - t0).total_seconds()


def _setup(
    tmp: Path, stages: list[str], worker: str, parallelism: int, options: dict[str, str | None]
) -> bench.Setup:
    """The bench set-up of one of our drains: its stage program and configuration file."""
    program = worker if worker in ("sdk", "sdk-gc", "raw", "raw-fork") else "sdk"
    setup = bench.Setup(tmp, stages, parallelism, 4, program)
    if worker == "sdk-default":
        setup.program.write_text(SDK_DEFAULT_WORKER.format(python=sys.executable))
    elif worker == "finish-many":
        setup.program.write_text(FINISH_MANY_WORKER.format(python=sys.executable))
    lines = [ln for ln in setup.conf.read_text().splitlines()]
    lines = [
        ln
        for ln in lines
        if not any(ln.startswith(f"{key} =") for key in options if key != "PARALLELISM")
    ]
    extra = [f"{k} = {v}" for k, v in options.items() if v is not None and k != "PARALLELISM"]
    setup.conf.write_text("\n".join(lines + extra) + "\n")
    return setup


def _wait_warm(
    conn: psycopg.Connection, proc: Any, stage: str, min_workers: int, timeout: float
) -> None:
    """With MIN_WORKERS: poll until that many of ``stage``'s workers are connected
    (``pg_stat_activity``, application_name ``pepsi-worker STAGE`` as the SDK and
    the finish_many worker set it), so the backlog meets them started, not starting.
    The caller's ``wait_idle`` then waits for their start-up CPU to settle."""
    if min_workers <= 0:
        return
    deadline = time.monotonic() + min(timeout, 60.0)
    while True:
        n = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s",
            (f"pepsi-worker {stage}",),
        ).fetchone()[0]  # type: ignore[index]
        if n >= min_workers:
            return
        if proc.poll() is not None:
            raise SystemExit(f"bench: dispatcher died ({proc.returncode})")
        if time.monotonic() > deadline:
            raise SystemExit(
                f"bench: {n} of MIN_WORKERS {min_workers} workers of {stage} connected"
                " (application_name 'pepsi-worker STAGE') after 60 s"
            )
        time.sleep(0.05)


def _wait_drained(
    conn: psycopg.Connection, proc: Any, stage: str, timeout: float, log: Path
) -> None:
    """Poll until no row of ``stage`` is pending or running (giving up, with the
    end of the dispatcher's ``log``, once nothing moves: :class:`~.core.Stall`)."""
    deadline = time.monotonic() + timeout
    stall = bench.Stall(conn, min(timeout, bench.STALL_AFTER))
    # (Partial-index lookups only: a poll must not cost the server what it measures.)
    while conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pepsi.workqueue WHERE stage = %s"
        " AND status = 'pending') OR EXISTS (SELECT 1 FROM pepsi.workqueue"
        " WHERE status = 'running' AND stage = %s)",
        (stage, stage),
    ).fetchone()[0]:  # type: ignore[index]
        if proc.poll() is not None:
            raise SystemExit(f"bench: dispatcher died ({proc.returncode})")
        stall.check([log])
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: not drained after {timeout} s")
        time.sleep(0.05)


#: The commit floor with the connections of a PARALLELISM 4 stage (its 4 workers).
FLOOR_4 = "pgbench floor: one-row-update commits, 4 clients (tps)"

_DEFAULTS: dict[str, str | None] = {"QUEUE_LIMIT": None, "MAX_MESSAGES": None}
_TUNED: dict[str, str | None] = {"QUEUE_LIMIT": "64", "MAX_MESSAGES": "1000000"}

#: Our configurations: label -> (worker, PARALLELISM, stage options; None = shipped default).
OURS: dict[str, tuple[str, int, dict[str, str | None]]] = {
    "pepsi-dispatch, shipped defaults (SDK, PARALLELISM 4 only)": ("sdk-default", 4, _DEFAULTS),
    "pepsi-dispatch, raw worker, shipped defaults (PARALLELISM 4 only)": ("raw", 4, _DEFAULTS),
    "pepsi-dispatch, pepsi.finish_many worker, shipped defaults (PARALLELISM 4 only)": (
        "finish-many",
        4,
        _DEFAULTS,
    ),
    # the price of recycling at shipped defaults: the row above, never recycled
    "pepsi-dispatch, raw worker, shipped QUEUE_LIMIT (4), MAX_MESSAGES 1,000,000": (
        "raw",
        4,
        {"QUEUE_LIMIT": None, "MAX_MESSAGES": "1000000"},
    ),
    "pepsi-dispatch, throughput settings: raw worker, P4 × Q64": ("raw", 4, _TUNED),
    "pepsi-dispatch, throughput settings: raw worker, P2 × Q256": (
        "raw",
        2,
        {"QUEUE_LIMIT": "256", "MAX_MESSAGES": "1000000"},
    ),
    "pepsi-dispatch, throughput settings: pepsi.finish_many worker, P2 × Q256": (
        "finish-many",
        2,
        {"QUEUE_LIMIT": "256", "MAX_MESSAGES": "1000000"},
    ),
    # a worker that moves its whole buffer in one statement gains from deeper buffers
    "pepsi-dispatch, throughput settings: pepsi.finish_many worker, P2 × Q1024": (
        "finish-many",
        2,
        {"QUEUE_LIMIT": "1024", "MAX_MESSAGES": "1000000"},
    ),
    # the same, its two workers kept started while idle: the burst pays no start-up
    "pepsi-dispatch, throughput settings: pepsi.finish_many worker, P2 × Q1024, MIN_WORKERS 2": (
        "finish-many",
        2,
        {"QUEUE_LIMIT": "1024", "MAX_MESSAGES": "1000000", "MIN_WORKERS": "2"},
    ),
    "pepsi-dispatch, raw worker with fork_point(), shipped defaults (PARALLELISM 4 only)": (
        "raw-fork",
        4,
        _DEFAULTS,
    ),
    "pepsi-dispatch, raw worker with fork_point(), P4 × Q64, shipped MAX_MESSAGES (1000)": (
        "raw-fork",
        4,
        {"QUEUE_LIMIT": "64", "MAX_MESSAGES": None},
    ),
    "pepsi-dispatch, raw worker, P4 × Q64, shipped MAX_MESSAGES (1000)": (
        "raw",
        4,
        {"QUEUE_LIMIT": "64", "MAX_MESSAGES": None},
    ),
    "pepsi-dispatch, SDK group commit, P4 × Q64": ("sdk-gc", 4, _TUNED),
    # run(handlers) as first documented, and the price of recycling with it
    "pepsi-dispatch, SDK run(handlers), P4 × Q64": ("sdk-default", 4, _TUNED),
    # the same, its workers kept started while idle (MIN_WORKERS, a stage setting):
    # the first worker's interpreter start is not inside the clock
    "pepsi-dispatch, SDK run(handlers), P4 × Q64, MIN_WORKERS 4": (
        "sdk-default",
        4,
        {"QUEUE_LIMIT": "64", "MAX_MESSAGES": "1000000", "MIN_WORKERS": "4"},
    ),
    "pepsi-dispatch, SDK run(handlers), P4 × Q64, shipped MAX_MESSAGES (1000)": (
        "sdk-default",
        4,
        {"QUEUE_LIMIT": "64", "MAX_MESSAGES": None},
    ),
    "pepsi-dispatch, SDK run(handlers), shipped QUEUE_LIMIT (4), MAX_MESSAGES 1,000,000": (
        "sdk-default",
        4,
        {"QUEUE_LIMIT": None, "MAX_MESSAGES": "1000000"},
    ),
    "pepsi-dispatch, SDK one commit per message, P4 × Q64": ("sdk", 4, _TUNED),
}


def main(
    dsn: str,
    messages: int,
    runs: int,
    folder: Path,
    timeout: float,
    only: str = "",
    costs: bool = False,
    warm: bool = True,
) -> int:
    """Run the side-by-side bench; print one table (and the cost table with ``costs``)."""
    folder = folder.resolve()
    peer_labels = (  # what peers() calls them, to match --peers-only against
        f"graphile-worker {GRAPHILE_VERSION}, default, concurrency 8",
        f"graphile-worker {GRAPHILE_VERSION}, perf preset, concurrency 8",
        "procrastinate 3.10, default (concurrency 1)",
        "procrastinate 3.10, concurrency 8",
        "PgQueuer 1.6, default (batch 10)",
        "PgQueuer 1.6, batch 100",
    )
    if not only or any(re.search(only, name) for name in peer_labels):
        have = install(folder)
    else:
        have = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        bench.machine_facts(conn)
    cconn = psycopg.connect(dsn, autocommit=True) if costs else None
    meter = Costs(cconn) if cconn is not None else None
    systems = _systems(dsn, messages, timeout, folder, have, only, meter, warm)
    clock = (
        "clock from the backlog's arrival (one enqueue, committed) at a service already"
        " running and idle to the last job done"
        if warm
        else "clock from the service's start (backlog waiting) to the last job done"
    )
    say(
        f"peers: {messages} no-op jobs per drain, {runs} round(s), systems interleaved in each"
        f" round; {clock}"
    )
    results: dict[str, list[float]] = {k: [] for k in systems}
    for r in range(runs):
        for label, fn in systems.items():
            results[label].append(fn())
            say(f"  round {r + 1}: {label}: {results[label][-1]:,.0f}/s")
    _table(results, runs)
    for line in round_ratios(results):
        say(line)
    if COSTS:
        _cost_table(runs)
    if cconn is not None:
        cconn.close()
    return 0


def _systems(
    dsn: str,
    messages: int,
    timeout: float,
    folder: Path,
    have: dict[str, bool],
    only: str,
    meter: Costs | None,
    warm: bool = True,
) -> dict[str, Callable[[], float]]:
    """label -> one drain of that system; ours first, then the peers, then the
    floors: each setting's statement floor, and pgbench's commit floor."""
    systems: dict[str, Callable[[], float]] = {}
    for label, (worker, par, opts) in OURS.items():
        systems[label] = lambda w=worker, p=par, o=opts, lab=label: ours(
            dsn, w, messages, p, o, timeout, lab, meter, warm
        )
    for label, peer in (peers(dsn, folder, have) if have else {}).items():
        peer.name = label
        systems[label] = lambda peer=peer: peer.drain(messages, timeout, meter, warm)
    if only:
        systems = {k: v for k, v in systems.items() if re.search(only, k)}
    for par, limit in sorted({statement_floor_of(k) for k in systems if k in OURS}):
        systems[floor_label(par, limit)] = lambda p=par, q=limit: floor(dsn, messages, p, q)[
            "msg_per_s"
        ]
    systems["pgbench floor: one-row-update commits, 8 clients (tps)"] = lambda: pgbench_floor(dsn)
    # the SDK's per-message goal compares with as many connections as its 4 workers have
    systems[FLOOR_4] = lambda: pgbench_floor(dsn, clients=4)
    return systems


def statement_floor_of(label: str) -> tuple[int, int]:
    """(PARALLELISM, QUEUE_LIMIT) of one of our rows: the setting of its statement floor."""
    _, par, opts = OURS[label]
    return par, int(opts.get("QUEUE_LIMIT") or StageConfig.queue_limit)


def floor_label(par: int, limit: int) -> str:
    """The name of the statement floor at PARALLELISM ``par`` × QUEUE_LIMIT ``limit``."""
    return f"statement floor: claim, pin, finish_many in a bare loop, P{par} × Q{limit} (msg/s)"


def _table(results: dict[str, list[float]], runs: int) -> None:
    """Medians, min–max and the ratios to graphile's perf preset, to the
    statement floor of the same setting (ours; per round, median) and to
    pgbench's commit floor."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    med = {k: statistics.median(v) for k, v in results.items()}
    ref = next((k for k in med if "perf preset" in k), None)
    commits = next(k for k in med if k.startswith("pgbench") and k != FLOOR_4)
    say()
    say(
        f"| system and settings | jobs/s median | min–max ({runs} runs)"
        " | × graphile perf | × its statement floor | × pgbench floor |"
    )
    say("|---|---|---|---|---|---|")
    for k, v in results.items():
        rel = f"{med[k] / med[ref]:.2f}" if ref else "-"
        own = "-"
        if k in OURS and floor_label(*statement_floor_of(k)) in results:
            base = results[floor_label(*statement_floor_of(k))]
            own = f"{statistics.median(r / b for r, b in zip(v, base, strict=True)):.2f}"
        fl = f"{med[k] / med[commits]:.2f}"
        say(f"| {k} | {med[k]:,.0f} | {min(v):,.0f}–{max(v):,.0f} | {rel} | {own} | {fl} |")
    say(f"load average after the run: {load}")


#: The references of the per-round ratios: the table's name of each, and its column.
RATIO_REFERENCES = (("perf preset", "× perf"), (", default, concurrency 8", "× default"))


def round_ratios(results: dict[str, list[float]]) -> list[str]:
    """Each of our rows against graphile-worker's presets in the same round.

    Drains are interleaved, so a round's systems met the same box; on a noisy
    VM the ratio of one round is steadier than the ratio of two medians taken
    from different rounds. One markdown table: per row, each reference's
    per-round ratios and their median. Empty when no reference ran.
    """
    refs = [
        (ref, head)
        for pattern, head in RATIO_REFERENCES
        for ref in results
        if ref.startswith("graphile-worker") and pattern in ref
    ]
    if not refs:
        return []
    lines = [
        "",
        "per round, against graphile-worker in the same round (median of the rounds' ratios):",
        "| system and settings | " + " | ".join(head for _, head in refs) + " |",
        "|---" * (len(refs) + 1) + "|",
    ]
    for label, rates in results.items():
        if not label.startswith("pepsi-dispatch"):
            continue
        cells = []
        for ref, _ in refs:
            ratios = [a / b for a, b in zip(rates, results[ref], strict=True) if b > 0]
            if not ratios:
                cells.append("-")
                continue
            rounds = " / ".join(f"{x:.2f}" for x in ratios)
            cells.append(f"{statistics.median(ratios):.2f} ({rounds})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _cost_table(runs: int) -> None:
    """Per-message costs, medians over the runs (server-wide counters: other load on the
    same server is counted too)."""
    cols = [
        ("service_cpu_us", "service CPU µs (dispatcher+workers / peer process)", 0),
        ("dispatcher_cpu_us", "of which dispatcher µs", 1),
        ("pg_cpu_us", "PostgreSQL CPU µs", 0),
        ("stmt_us", "statement time µs (pg_stat_statements)", 1),
        ("wal_bytes", "WAL bytes", 0),
        ("wal_records", "WAL records", 1),
        ("commits", "write commits", 2),
        ("fsyncs", "WAL fsyncs", 3),
    ]
    say()
    say(f"per message (median of {runs} runs; server-wide counters):")
    say("| system | " + " | ".join(c[1] for c in cols) + " |")
    say("|---" * (len(cols) + 1) + "|")
    for label, rows in COSTS.items():
        cells = []
        for key, _, digits in cols:
            vals = [r[key] for r in rows if key in r]
            cells.append(f"{statistics.median(vals):,.{digits}f}" if vals else "-")
        say(f"| {label} | " + " | ".join(cells) + " |")
