"""``--bulk``: 100,000 messages in, against a bare COPY of the same rows (the floor).

Each round times, on an emptied ``pepsi.workqueue`` after a CHECKPOINT:

- ``copy``: ``COPY pepsi.workqueue (stage, payload)`` of the JSON-lines file's
  lines (in this process, as ``psql \\copy`` would send them) -- the floor;
  ``copy+keys`` adds ``priority`` and ``dedupe_key`` columns;
- ``copy dicts``: the same rows from Python dicts (``json.dumps`` + COPY), the
  floor for a Python producer holding dicts; ``copy dicts+keys`` with
  ``priority`` and ``dedupe_key``, the floor of ``enqueue_many+keys``;
- ``enqueue_many`` (dicts; on an autocommit connection: its COPY path; the
  bench's login, usually the schema owner, whose COPY the insert trigger
  does not check again), ``enqueue_many as producer`` (the same as a login in
  ``pepsi_ingress``, made when missing: its rows are checked; its connect
  counts),
  ``enqueue_many in a tx`` (inside the caller's transaction: one
  ``pepsi.enqueue_lines`` statement per chunk) and ``enqueue_many+keys``
  (priority 5, one key per row: its keyed COPY path, no key held);
- ``cli``: ``pepsi-queue enqueue bench - --force -q < FILE`` (a new process:
  its start-up counts) and ``cli+keys`` (``--key-field key --priority 5``);
- ``graphile add_jobs`` (and ``+keys``: a ``job_key`` and a priority each):
  the statement graphile-worker's ``addJobs`` sends, with the same payloads
  as one JSON text (``json_populate_recordset`` into ``add_jobs``), in its
  own database (``pepsi_peer_graphile``, migrated by graphile-worker itself),
  when ``--peers-dir`` holds graphile-worker (installed there if node/npm
  are found).

Rounds are interleaved; ratios are floor time / time (1.0: as fast as COPY),
and for ours also graphile's time / ours.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from pepsi_dispatch.devtools.bench.core import say
from pepsi_dispatch.enqueue import enqueue_many

STAGE = "bench"


def _rows(n: int) -> list[dict[str, object]]:
    return [
        {"n": i, "key": f"k-{i}", "url": f"https://example.org/doc/{i}", "tags": ["a", "b"]}
        for i in range(n)
    ]


def _copy_text(lines: bytes, keys: bool) -> bytes:
    """The JSON lines as COPY text rows (backslash, tab and CR escaped)."""
    esc = lines.replace(b"\\", b"\\\\").replace(b"\t", b"\\t").replace(b"\r", b"\\r")
    out = []
    for i, line in enumerate(esc.split(b"\n")[:-1]):
        out.append(
            b"%s\t%s\t5\tk-%d\n" % (STAGE.encode(), line, i) if keys else b"bench\t" + line + b"\n"
        )
    return b"".join(out)


#: The statement of graphile-worker 0.17's addJobs (helpers.js, makeAddJobs).
GRAPHILE_ADD_JOBS = (
    "SELECT * FROM graphile_worker.add_jobs(array(SELECT json_populate_recordset("
    "null::graphile_worker.job_spec, %s::json)), false)"
)


def _graphile_dsn(dsn: str, peers_dir: Path | None) -> str | None:
    """The migrated graphile-worker database beside ``dsn``, or None (not installed)."""
    if peers_dir is None:
        return None
    from pepsi_dispatch.devtools.bench.peer_drivers import _dsn_for, _ensure_db, _url_for, install

    if not install(peers_dir).get("graphile"):
        say("bulk: graphile-worker is not installed (node/npm missing); its rows are left out")
        return None
    with psycopg.connect(dsn, autocommit=True) as admin:
        _ensure_db(admin, "pepsi_peer_graphile")
    node = ["node", str(peers_dir.resolve() / "graphile_run.js")]
    subprocess.run([*node, _url_for(dsn, "pepsi_peer_graphile"), "migrate"], check=True)
    return _dsn_for(dsn, "pepsi_peer_graphile")


#: A login role in pepsi_ingress for the producer rows (the schema owner's own
#: COPY skips the insert trigger's payload check; a producer's does not).
PRODUCER = "pepsi_bench_producer"


def _producer_dsn(dsn: str) -> str | None:
    """A DSN for PRODUCER on ``dsn``'s server (made when missing), or None when
    this login cannot make it or connect as it (say, a password is needed)."""
    from psycopg.conninfo import make_conninfo

    try:
        with psycopg.connect(dsn, autocommit=True) as admin:
            if not admin.execute(
                "SELECT 1 FROM pg_roles WHERE rolname = %s", (PRODUCER,)
            ).fetchone():
                admin.execute(f"CREATE ROLE {PRODUCER} LOGIN IN ROLE pepsi_ingress")
        producer = make_conninfo(dsn, user=PRODUCER)
        psycopg.connect(producer).close()
        return producer
    except psycopg.Error as exc:
        say(f"bulk: no producer login ({' '.join(str(exc).split())[:120]}); its row is left out")
        return None


def main(dsn: str, n: int, rounds: int, peers_dir: Path | None = None) -> int:
    """Run ``rounds`` interleaved rounds of every variant; print times and ratios."""
    rows = _rows(n)
    raw = "".join(json.dumps(r) + "\n" for r in rows).encode()
    keys = [str(r["key"]) for r in rows]
    copy_plain = _copy_text(raw, keys=False)
    copy_keyed = _copy_text(raw, keys=True)
    queue = str(Path(sys.executable).with_name("pepsi-queue"))
    env = {**os.environ, "PEPSI_DSN": dsn, "PEPSI_CONFIG": ""}
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
        f.write(raw)
        f.flush()

        def cli(*extra: str) -> Callable[[psycopg.Connection], None]:
            def run(_: psycopg.Connection) -> None:
                with open(f.name, "rb") as stdin:
                    subprocess.run(
                        [queue, "enqueue", STAGE, "-", "--force", "-q", *extra],
                        stdin=stdin,
                        stdout=subprocess.DEVNULL,
                        env=env,
                        check=True,
                    )

            return run

        def copy(data: bytes, cols: str) -> Callable[[psycopg.Connection], None]:
            def run(conn: psycopg.Connection) -> None:
                with (
                    conn.transaction(),
                    conn.cursor().copy(f"COPY pepsi.workqueue ({cols}) FROM STDIN") as cp,
                ):
                    cp.write(data)

            return run

        def copy_dicts(conn: psycopg.Connection) -> None:
            with (
                conn.transaction(),
                conn.cursor().copy("COPY pepsi.workqueue (stage, payload) FROM STDIN") as cp,
            ):
                for r in rows:
                    cp.write_row((STAGE, json.dumps(r)))

        def copy_dicts_keys(conn: psycopg.Connection) -> None:
            cols = "stage, payload, priority, dedupe_key"
            with (
                conn.transaction(),
                conn.cursor().copy(f"COPY pepsi.workqueue ({cols}) FROM STDIN") as cp,
            ):
                for r, k in zip(rows, keys, strict=True):
                    cp.write_row((STAGE, json.dumps(r), 5, k))

        def api(conn: psycopg.Connection) -> None:
            enqueue_many(conn, STAGE, rows)

        def api_in_transaction(conn: psycopg.Connection) -> None:
            with conn.transaction():  # the caller's transaction: the statement path
                enqueue_many(conn, STAGE, rows)

        def api_keys(conn: psycopg.Connection) -> None:
            enqueue_many(conn, STAGE, rows, priority=5, dedupe_keys=keys)

        def graphile(keyed: bool) -> Callable[[psycopg.Connection], None]:
            def run(gconn: psycopg.Connection) -> None:
                specs = [
                    {"identifier": "noop", "payload": r, "job_key": r["key"], "priority": 5}
                    if keyed
                    else {"identifier": "noop", "payload": r}
                    for r in rows
                ]
                gconn.execute(GRAPHILE_ADD_JOBS, (json.dumps(specs),)).fetchall()

            return run

        # name -> (run, its floor, its database: ours or graphile-worker's)
        variants: dict[str, tuple[Callable[[psycopg.Connection], None], str, bool]] = {
            "copy": (copy(copy_plain, "stage, payload"), "copy", False),
            "copy dicts": (copy_dicts, "copy dicts", False),
            "enqueue_many": (api, "copy dicts", False),
            "enqueue_many in a tx": (api_in_transaction, "copy dicts", False),
            "cli": (cli(), "copy", False),
            "copy+keys": (
                copy(copy_keyed, "stage, payload, priority, dedupe_key"),
                "copy+keys",
                False,
            ),
            "copy dicts+keys": (copy_dicts_keys, "copy dicts+keys", False),
            "enqueue_many+keys": (api_keys, "copy dicts+keys", False),
            "cli+keys": (cli("--key-field", "key", "--priority", "5"), "copy+keys", False),
        }
        producer = _producer_dsn(dsn)
        if producer is not None:

            def api_as_producer(_: psycopg.Connection) -> None:
                with psycopg.connect(producer, autocommit=True) as pconn:
                    enqueue_many(pconn, STAGE, rows)

            variants["enqueue_many as producer"] = (api_as_producer, "copy dicts", False)
        gdsn = _graphile_dsn(dsn, peers_dir)
        if gdsn is not None:
            variants["graphile add_jobs"] = (graphile(False), "copy dicts", True)
            variants["graphile add_jobs+keys"] = (graphile(True), "copy+keys", True)
        against = {
            "enqueue_many": "graphile add_jobs",
            "cli": "graphile add_jobs",
            "enqueue_many+keys": "graphile add_jobs+keys",
            "cli+keys": "graphile add_jobs+keys",
        }
        times: dict[str, list[float]] = {v: [] for v in variants}
        say(
            f"bulk enqueue: {n:,} messages, {rounds} interleaved rounds, {len(raw):,} bytes of JSON"
        )
        with (
            psycopg.connect(dsn, autocommit=True) as conn,
            psycopg.connect(gdsn or dsn, autocommit=True) as gconn,
        ):
            for r in range(rounds):
                for name, (run, _, theirs) in variants.items():
                    c = gconn if theirs else conn
                    table = "graphile_worker._private_jobs" if theirs else "pepsi.workqueue"
                    c.execute(f"TRUNCATE {table}")
                    c.execute("CHECKPOINT")
                    t0 = time.perf_counter()
                    run(c)
                    elapsed = time.perf_counter() - t0
                    got = c.execute(f"SELECT count(*) FROM {table}").fetchone()
                    assert got is not None and got[0] == n, (name, got)
                    times[name].append(elapsed)
                    say(
                        f"  round {r + 1} {name:<24} {elapsed:6.3f} s"
                        f"  (load {os.getloadavg()[0]:.2f})"
                    )
        say(
            "  variant                  seconds per round         median   ratio to its floor"
            " (median of the rounds' ratios)"
        )
        for name, (_, floor, _) in variants.items():
            med = statistics.median(times[name])
            per = " / ".join(f"{t:.3f}" for t in times[name])
            # each round's ratio to the floor of the same round: the VM's speed drifts
            ratios = [f / t for f, t in zip(times[floor], times[name], strict=True)]
            per_ratio = " / ".join(f"{x:.2f}" for x in ratios)
            say(
                f"  {name:<24} {per:<26} {med:6.3f}   {statistics.median(ratios):.2f}"
                f" (of {floor}; per round {per_ratio})"
            )
        for ours, peer in against.items():
            if peer in times:
                ratios = [g / o for g, o in zip(times[peer], times[ours], strict=True)]
                say(
                    f"  {ours:<24} {statistics.median(ratios):.2f}x the speed of {peer}"
                    f" (per round {' / '.join(f'{x:.2f}' for x in ratios)})"
                )
    return 0
