"""``make bench`` / ``python -m pepsi_dispatch.devtools.bench``: the benchmark's command line.

Chooses the run: the throughput and latency runs of :mod:`.core`, the side-by-side
run against peer queues (:mod:`.peers`), or the scrape comparison (:mod:`.scrape`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import psycopg

from pepsi_dispatch.devtools.bench import funcstats, recycling
from pepsi_dispatch.devtools.bench.core import latency, machine_facts, say, throughput
from pepsi_dispatch.devtools.bench.floor import floor


def main(argv: list[str] | None = None) -> int:
    """Command line; see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m pepsi_dispatch.devtools.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--queue-limit", type=int, default=32)
    parser.add_argument(
        "--max-messages", type=int, default=1_000_000, help="MAX_MESSAGES of every stage"
    )
    parser.add_argument(
        "--worker",
        action="append",
        choices=["sdk-default", "sdk", "sdk-gc", "raw", "raw-fork"],
        help="stage program(s) to measure (repeatable; default: sdk, sdk-gc, raw)",
    )
    parser.add_argument("--group-commit", action="store_true", help="shorthand for --worker sdk-gc")
    parser.add_argument(
        "--latency",
        type=int,
        default=200,
        metavar="N",
        help="latency samples (0: skip the latency run)",
    )
    parser.add_argument("--no-throughput", action="store_true", help="only the latency run")
    parser.add_argument(
        "--latency-peer",
        action="store_true",
        help="also measure graphile-worker's latency the same way, in --runs interleaved rounds",
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="enqueue while the dispatcher runs (no ANALYZE first; clock from the first enqueue)",
    )
    parser.add_argument(
        "--replicas",
        default="",
        metavar="N,N,...",
        help="also run each worker with N competing dispatchers sharing the stages"
        " (PARALLELISM split between them, same total), interleaved, with the ratio"
        " to one dispatcher; e.g. 1,2,4",
    )
    parser.add_argument(
        "--floor",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="measure, each round, the floor: the drain's statements (claim, pin,"
        " finish_many) in a bare loop on PARALLELISM connections, batches of QUEUE_LIMIT,"
        " 1 stage (see devtools/bench/floor.py); rows get their ratio to it (default: on"
        " with --stages 1, whose drains it is the floor of; --peers measures one per"
        " setting of its rows)",
    )
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument(
        "--repeat", type=int, default=1, help="run the workers N times, interleaved; medians"
    )
    parser.add_argument(
        "--scrape",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="each throughput run alone and with pepsi-httpd's /metrics scraped every SECONDS,"
        " side by side (default worker sdk-gc; see devtools/bench/scrape.py)",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="side by side with graphile-worker, procrastinate, PgQueuer and the pgbench"
        " commit floor, 1 stage (see pepsi_dispatch.devtools.bench.peers); installs them first",
    )
    parser.add_argument("--runs", type=int, default=3, help="--peers: interleaved rounds")
    parser.add_argument("--peers-dir", default=".bench-peers", help="--peers: scratch folder")
    parser.add_argument("--peers-only", default="", help="--peers: regex of systems to run")
    parser.add_argument(
        "--costs",
        action="store_true",
        help="--peers: per-message CPU, WAL, commits, fsyncs; the throughput run: each SDK"
        " row's drain paired with one at a MAX_MESSAGES never reached, for the recycles,"
        " the pass-on rate of sessions and the CPU per recycle"
        " (see pepsi_dispatch.devtools.bench.recycling)",
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="--peers: start each service on the waiting backlog and count its start-up"
        " (default: the backlog arrives at a service already running)",
    )
    parser.add_argument(
        "--bulk",
        action="store_true",
        help="bulk enqueue: --messages (default here 100,000) through COPY (the floor),"
        " enqueue_many, pepsi-queue enqueue - and graphile-worker's add_jobs, with and"
        " without keys; --runs rounds"
        " (see pepsi_dispatch.devtools.bench.bulk)",
    )
    args = parser.parse_args(argv)
    dsn = os.environ.get("PEPSI_DSN")
    if not dsn:
        print("bench: PEPSI_DSN is not set; run 'make bench'", file=sys.stderr)
        return 2
    if args.bulk:
        from pepsi_dispatch.devtools.bench import bulk

        with psycopg.connect(dsn, autocommit=True) as conn:
            machine_facts(conn)
        n = args.messages if "--messages" in (argv or sys.argv) else 100_000
        return bulk.main(dsn, n, args.runs, Path(args.peers_dir))
    if args.scrape > 0:
        from pepsi_dispatch.devtools.bench.scrape import compare

        with psycopg.connect(dsn, autocommit=True) as conn:
            machine_facts(conn)
        return compare(dsn, args)
    if args.peers:
        from pepsi_dispatch.devtools.bench import peers as bench_peers

        return bench_peers.main(
            dsn,
            args.messages,
            args.runs,
            Path(args.peers_dir),
            args.timeout,
            args.peers_only,
            args.costs,
            warm=not args.cold,
        )
    workers = args.worker or (["sdk-gc"] if args.group_commit else ["sdk", "sdk-gc", "raw"])
    with psycopg.connect(dsn, autocommit=True) as conn:
        machine_facts(conn)
    if not args.no_throughput:
        say(
            f"throughput: {args.messages} messages through {args.stages} no-op stages,"
            f" PARALLELISM={args.parallelism} QUEUE_LIMIT={args.queue_limit}"
            f" MAX_MESSAGES={args.max_messages}"
        )
        counts = [0, *(int(n) for n in args.replicas.split(",") if n.strip())]
        runs = [(w, n) for w in workers for n in counts]
        with_floor = args.floor or (args.floor is None and args.stages == 1)
        if with_floor:
            runs.append(("floor", 0))
        results: dict[tuple[str, int], list[dict[str, float]]] = {r: [] for r in runs}
        recycle_costs: dict[str, list[dict[str, float]]] = {}
        for i, (worker, replicas) in enumerate(
            [r for _ in range(args.repeat) for r in runs]  # interleaved
        ):
            if worker == "floor":
                r = floor(dsn, args.messages, args.parallelism, args.queue_limit)
                say(
                    f"  {'floor':<11} {r['elapsed']:7.2f} s  {r['msg_per_s']:8.0f} messages/s"
                    f"  (claim, pin, finish_many in a bare loop on {args.parallelism}"
                    f" connection(s), batches of {args.queue_limit}, 1 stage;"
                    f" load {os.getloadavg()[0]:.1f})"
                )
                results[(worker, replicas)].append(r)
                continue
            costs = args.costs and worker in recycling.SDK_WORKERS
            # --costs: the same drain with no recycle, first in every other round
            order = [args.max_messages, recycling.NEVER] if costs else [args.max_messages]
            if costs and (i // len(runs)) % 2:
                order.reverse()
            drains: dict[int, dict[str, Any]] = {}
            for max_messages in order:
                r = throughput(
                    dsn,
                    worker,
                    args.messages,
                    args.stages,
                    args.parallelism,
                    args.queue_limit,
                    args.timeout,
                    live=args.live,
                    max_messages=max_messages,
                    replicas=replicas,
                    costs=costs,
                )
                drains[max_messages] = r
                label = row_label(worker, replicas)
                if max_messages == recycling.NEVER:
                    label += " (base)"
                say(
                    f"  {label:<11} {r['elapsed']:7.2f} s  {r['msg_per_s']:8.0f} messages/s"
                    f"  {r['runs_per_s']:8.0f} stage runs/s  (enqueue {r['enqueue']:.2f} s,"
                    f" stage_runs {r['stage_runs']}, not done {r['failed']},"
                    f" dispatcher exit {r['exit']}, load {os.getloadavg()[0]:.1f})"
                )
                if "functions" in r:
                    text = funcstats.line(r["functions"], args.messages)
                    if r.get("functions_partial"):
                        # a session outside the drain, or one still ending: not all counted
                        text += " (partial: other sessions were still on the database)"
                    say(text)
                if costs:
                    say(recycling.drain_line(r["drain"]))
            r = drains[args.max_messages]
            results[(worker, replicas)].append(r)
            if costs:
                pair = recycling.per_recycle(r["drain"], drains[recycling.NEVER]["drain"])
                recycle_costs.setdefault(row_label(worker, replicas), []).append(pair)
                say(recycling.pair_line(pair))
        if args.repeat > 1 or len(counts) > 1 or with_floor:
            say(f"  median of {args.repeat} interleaved runs:")
            for (worker, replicas), rs in results.items():
                label = row_label(worker, replicas)
                line = f"  {label:<11} {statistics.median(x['msg_per_s'] for x in rs):8.0f}"
                if worker == "floor":
                    say(line + " messages/s")
                    continue
                line += (
                    f" messages/s  {statistics.median(x['runs_per_s'] for x in rs):8.0f}"
                    " stage runs/s"
                )
                if with_floor and args.stages == 1:
                    # the median of the per-round ratios to the floor of the same round
                    bare = results[("floor", 0)]
                    to_floor = [
                        x["msg_per_s"] / f["msg_per_s"] for x, f in zip(rs, bare, strict=True)
                    ]
                    line += f"  ({statistics.median(to_floor):.2f}× the floor)"
                if replicas:
                    # the median of the per-round ratios to one dispatcher
                    alone = results[(worker, 0)]
                    ratios = [
                        x["msg_per_s"] / a["msg_per_s"] for x, a in zip(rs, alone, strict=True)
                    ]
                    line += f"  ({statistics.median(ratios):.2f}× one dispatcher)"
                say(line)
        if recycle_costs:
            say(
                f"  recycling at MAX_MESSAGES {args.max_messages}, against the same drain"
                f" with no recycle (median of {args.repeat} round(s);"
                f" load {os.getloadavg()[0]:.1f}):"
            )
            for label, pairs in recycle_costs.items():
                say(recycling.summary_line(label, pairs))
    if args.latency > 0 and args.latency_peer:
        return latency_against_graphile(dsn, args.latency, args.runs, Path(args.peers_dir))
    if args.latency > 0:
        say_latency(latency(dsn, args.latency, 30))
    return 0


def row_label(worker: str, replicas: int) -> str:
    """A throughput row's name: the worker, and how many competing dispatchers."""
    return worker if not replicas else f"{worker} ×{replicas} competing"


def say_latency(
    r: dict[str, float], who: str = "idle dispatcher, enqueue -> handler start"
) -> None:
    """Print one latency run."""
    say(
        f"latency ({who}, {r['n']:.0f} sequential messages):"
        f" p50 {r['p50'] * 1000:.2f} ms  p95 {r['p95'] * 1000:.2f} ms"
        f"  p99 {r['p99'] * 1000:.2f} ms  max {r['max'] * 1000:.2f} ms"
        f"  (first message, worker start: {r['cold'] * 1000:.0f} ms)"
    )
    say(
        f"  of which the enqueue's own round trip (its commit): p50"
        f" {r['enqueue_p50'] * 1000:.2f} ms  p99 {r['enqueue_p99'] * 1000:.2f} ms;"
        f" from the commit returned: p50 {r['after_commit_p50'] * 1000:.2f} ms"
        f"  p99 {r['after_commit_p99'] * 1000:.2f} ms"
    )


def latency_against_graphile(dsn: str, count: int, runs: int, folder: Path) -> int:
    """Our idle latency and graphile-worker's, interleaved over ``runs`` rounds,
    each measured from just before the enqueue call to the handler's (task's)
    start (p50, p99) and from the enqueue's commit returned (``after_commit_*``);
    the medians of the per-round ratios."""
    from pepsi_dispatch.devtools.bench.peer_drivers import graphile_latency, install

    if not install(folder).get("graphile"):
        say("bench: graphile-worker is not installed (node/npm missing)")
        return 2
    ratios: dict[str, list[float]] = {
        k: [] for k in ("p50", "p99", "after_commit_p50", "after_commit_p99")
    }
    for n in range(1, runs + 1):
        ours = latency(dsn, count, 30)
        theirs = graphile_latency(dsn, folder, count, 30)
        say(f"round {n} (load {os.getloadavg()[0]:.1f}):")
        say_latency(ours, "ours, SDK at shipped defaults")
        say_latency(theirs, "graphile-worker, default preset")
        for key, rs in ratios.items():
            rs.append(ours[key] / theirs[key])
    for what, rs in ratios.items():
        each = " / ".join(f"{r:.2f}" for r in rs)
        say(f"ours / graphile, {what}: median {statistics.median(rs):.2f}× ({each})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
