"""`make demo`: run the docpipe sample pipeline (examples/) end to end.

    PEPSI_DSN=... python -m pepsi_dispatch.devtools.demo [--messages N] [--timeout S]

Needs ``PEPSI_DSN`` naming a database migrated to head (``make demo`` sets it,
starting an embedded cluster when the user has none). The demo

1. creates the example's result table and removes its own earlier demo rows,
2. starts ``pepsi-dispatch -c examples/pepsi.conf serve`` as a child process
   (its log goes to a file, named on screen),
3. enqueues N documents at stage ``fetch`` with ``enqueue_many``,
4. prints a progress line every second (per stage: pending/running/paused; done,
   failed; messages per second) until every message is done or failed,
5. stops the dispatcher with SIGTERM, checks it exits 0, and prints a summary of
   what ``stage_stats`` / ``dispatch_stats`` gained during the run,
6. ends with what to try next on the demo's database: the one command that
   opens the dashboard, and pepsi-queue commands.

Exit status 0 on success; 1 when something went wrong (the reason is printed).
No process is left behind: the dispatcher's workers end with it, and the demo
kills the dispatcher if it does not stop in time.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from pepsi_dispatch.enqueue import enqueue_many

ROOT = Path(__file__).resolve().parents[2]  # the checkout: pepsi_dispatch/devtools/demo.py
EXAMPLES = ROOT / "examples"
STAGES = ("fetch", "normalise", "extract", "store")
TERMINAL = ("done", "failed", "timeout", "expired")
STAGE_STAT_COLS = ("processed", "failed", "timeouts", "crashes", "processing_seconds")
DISPATCH_STAT_COLS = (
    "stage_runs",
    "messages",
    "failed",
    "timeouts",
    "crashes",
    "requeued",
    "expired",
)


def say(text: str = "") -> None:
    print(text, flush=True)


def dispatcher_command() -> list[str]:
    """How to start pepsi-dispatch with the interpreter running us."""
    script = Path(sys.executable).parent / "pepsi-dispatch"
    if script.exists():
        return [str(script)]
    return [
        sys.executable,
        "-c",
        "import sys; from pepsi_dispatch.cli.dispatch import main; sys.exit(main())",
    ]


def demo_env(examples: Path) -> dict[str, str]:
    """Environment of the dispatcher (and so of its workers)."""
    env = dict(os.environ)
    env["PEPSI_EXAMPLES"] = str(examples)
    # Keep the invoking user: as root the dispatcher would otherwise switch to 'pepsi'.
    env["PEPSI_SERVICE_USER"] = pwd.getpwuid(os.getuid()).pw_name
    # docpipe.py starts with '#!/usr/bin/env python3': find this interpreter first.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("DOCPIPE_RETRY_DELAY", "0.3")
    env.pop("PEPSI_CONFIG", None)
    return env


def _stats(conn: psycopg.Connection) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    stages: dict[str, dict[str, float]] = {}
    for row in conn.execute(
        "SELECT stage, " + ", ".join(STAGE_STAT_COLS) + " FROM pepsi.stage_stats"
    ):
        stages[row[0]] = dict(zip(STAGE_STAT_COLS, row[1:], strict=True))
    got = conn.execute("SELECT " + ", ".join(DISPATCH_STAT_COLS) + " FROM pepsi.dispatch_stats")
    row = got.fetchone()
    totals = dict(zip(DISPATCH_STAT_COLS, row, strict=True)) if row else {}
    return stages, totals


def _counts(conn: psycopg.Connection, first: int, last: int) -> dict[tuple[str, str], int]:
    rows = conn.execute(
        "SELECT stage, status, count(*) FROM pepsi.workqueue"
        " WHERE workqueue_id BETWEEN %s AND %s GROUP BY 1, 2",
        (first, last),
    ).fetchall()
    return {(stage, status): n for stage, status, n in rows}


def progress_line(elapsed: float, counts: dict[tuple[str, str], int], rate: float) -> str:
    """One progress line: per stage pending/running/paused, then done, failed, msg/s."""
    parts = []
    for stage in STAGES:
        p = counts.get((stage, "pending"), 0)
        r = counts.get((stage, "running"), 0)
        z = counts.get((stage, "paused"), 0)
        parts.append(f"{stage} {p}/{r}/{z}")
    done = sum(n for (_, status), n in counts.items() if status == "done")
    failed = sum(n for (_, status), n in counts.items() if status in TERMINAL[1:])
    return (
        f"{elapsed:5.1f}s  " + "  ".join(parts) + f"  | done {done} failed {failed}"
        f" | {rate:.0f} msg/s"
    )


def _log_tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    """SIGTERM, wait; SIGKILL after the timeout. Returns the exit status (None if killed)."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def prepare(conn: psycopg.Connection) -> None:
    """Check the schema, create docpipe.invoices, drop earlier demo rows."""
    ok = conn.execute("SELECT to_regprocedure('pepsi.hop(bigint,text,text,bigint)')").fetchone()
    if not ok or ok[0] is None:
        raise SystemExit(
            "demo: the database is not migrated to head; run: PEPSI_DSN=... pepsi-queue migrate"
        )
    sys.path.insert(0, str(EXAMPLES))
    try:
        import docpipe  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    conn.execute(docpipe.SCHEMA)
    conn.execute("TRUNCATE docpipe.invoices")
    conn.execute("DELETE FROM pepsi.workqueue WHERE stage = ANY(%s)", (list(STAGES),))


def run_demo(dsn: str, messages: int, timeout: float, examples: Path = EXAMPLES) -> int:
    """The demo; returns the exit status."""
    conf = examples / "pepsi.conf"
    env = demo_env(examples)
    env["PEPSI_DSN"] = dsn
    with psycopg.connect(dsn, autocommit=True, application_name="pepsi-demo") as conn:
        prepare(conn)
        stages_before, totals_before = _stats(conn)
        logdir = Path(tempfile.mkdtemp(prefix="pepsi-demo-"))
        log = logdir / "dispatcher.log"
        cmd = [*dispatcher_command(), "-c", str(conf), "-L", "INFO", "-l", str(log), "serve"]
        say(f"demo: pipeline fetch -(fused)-> normalise -> extract -> store ({conf})")
        say(f"demo: starting pepsi-dispatch -c {conf} serve  (log: {log})")
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(logdir / "dispatcher.stderr", "wb"),  # noqa: SIM115
            start_new_session=True,
        )
        try:
            return _drive(conn, proc, messages, timeout, log, logdir, stages_before, totals_before)
        except KeyboardInterrupt:
            say("demo: interrupted; stopping the dispatcher")
            _stop(proc, 15)
            return 1
        finally:
            if proc.poll() is None:
                _stop(proc, 15)
            if proc.returncode == 0:
                shutil.rmtree(logdir, ignore_errors=True)


def _drive(
    conn: psycopg.Connection,
    proc: subprocess.Popen[bytes],
    messages: int,
    timeout: float,
    log: Path,
    logdir: Path,
    stages_before: dict[str, dict[str, float]],
    totals_before: dict[str, float],
) -> int:
    time.sleep(0.3)
    if proc.poll() is not None:
        say(f"demo: the dispatcher exited at once with status {proc.returncode}:")
        say((logdir / "dispatcher.stderr").read_text(errors="replace") or _log_tail(log))
        return 1
    payloads = [{"doc_id": i, "source": "scanner-3"} for i in range(1, messages + 1)]
    t0 = time.monotonic()
    ids = enqueue_many(conn, "fetch", payloads)
    first, last = ids[0], ids[-1]
    say(f"demo: enqueued {len(ids)} documents at stage fetch in {time.monotonic() - t0:.2f} s")
    say("demo: progress, per stage: pending/running/paused")
    start = time.monotonic()
    deadline = start + timeout
    prev_terminal, prev_t = 0, start
    while True:
        time.sleep(1.0)
        now = time.monotonic()
        counts = _counts(conn, first, last)
        terminal = sum(n for (_, status), n in counts.items() if status in TERMINAL)
        rate = (terminal - prev_terminal) / (now - prev_t)
        prev_terminal, prev_t = terminal, now
        say(progress_line(now - start, counts, rate))
        if terminal >= len(ids):
            break
        if proc.poll() is not None:
            say(f"demo: the dispatcher died with status {proc.returncode}; log tail:")
            say(_log_tail(log))
            return 1
        if now > deadline:
            say(f"demo: not finished after {timeout:.0f} s; stopping (log: {log})")
            _stop(proc, 15)
            return 1
    elapsed = time.monotonic() - start
    rc = _stop(proc, 20)
    if rc != 0:
        say(f"demo: the dispatcher did not exit cleanly (status {rc}); log tail:")
        say(_log_tail(log))
        return 1
    say(f"demo: all {len(ids)} messages terminal after {elapsed:.1f} s; dispatcher exited 0")
    summary(conn, first, last, elapsed, stages_before, totals_before)
    explore(conn, first, last)
    return 0


def explore(conn: psycopg.Connection, first: int, last: int) -> None:
    """What to try next, on this database: the dashboard and pepsi-queue."""
    dsn = os.environ.get("PEPSI_DSN") or conn.info.dsn
    row = conn.execute(
        "SELECT max(workqueue_id) FROM pepsi.workqueue"
        " WHERE workqueue_id BETWEEN %s AND %s AND status <> 'done'",
        (first, last),
    ).fetchone()
    some = row[0] if row and row[0] is not None else last
    bin_ = Path(sys.executable).parent
    say()
    say("Explore it (the demo's database keeps running until 'make demo-stop'):")
    say(f"  export PEPSI_DSN={shlex.quote(dsn)}")
    say(f"  {bin_}/pepsi-httpd --allow-actions     # the dashboard: http://127.0.0.1:9187/")
    say(f"  {bin_}/pepsi-queue status")
    say(f"  {bin_}/pepsi-queue failed --by-reason")
    say(f"  {bin_}/pepsi-queue list --status failed --limit 10")
    say(f"  {bin_}/pepsi-queue show {some}           # its attempts and errors")
    say(f"  {bin_}/pepsi-queue requeue --stage extract")
    say(f"  {bin_}/pepsi-queue enqueue fetch '{{\"doc_id\": 1}}'")


def summary(
    conn: psycopg.Connection,
    first: int,
    last: int,
    elapsed: float,
    stages_before: dict[str, dict[str, float]],
    totals_before: dict[str, float],
) -> None:
    """Print what the run added to stage_stats / dispatch_stats, and the outcome."""
    stages_after, totals_after = _stats(conn)
    say()
    say("Summary")
    say("=======")
    say("stage_stats (this run):")
    say(
        f"  {'stage':<10} {'processed':>9} {'failed':>7} {'timeouts':>8} {'crashes':>7}"
        f" {'avg ms':>8}"
    )
    for stage in STAGES:
        after = stages_after.get(stage, {})
        before = stages_before.get(stage, {})
        d = {k: (after.get(k, 0) or 0) - (before.get(k, 0) or 0) for k in STAGE_STAT_COLS}
        runs = d["processed"] + d["failed"]
        avg = 1000 * d["processing_seconds"] / runs if runs else 0.0
        say(
            f"  {stage:<10} {int(d['processed']):>9} {int(d['failed']):>7}"
            f" {int(d['timeouts']):>8} {int(d['crashes']):>7} {avg:>8.2f}"
        )
    d = {
        k: (totals_after.get(k, 0) or 0) - (totals_before.get(k, 0) or 0)
        for k in DISPATCH_STAT_COLS
    }
    say("dispatch_stats (this run): " + ", ".join(f"{k} {int(v)}" for k, v in d.items()))
    counts = _counts(conn, first, last)
    by_status: dict[str, int] = {}
    for (_, status), n in counts.items():
        by_status[status] = by_status.get(status, 0) + n
    total = last - first + 1
    say(
        "messages: "
        + ", ".join(f"{s} {n}" for s, n in sorted(by_status.items()))
        + f" of {total}; {total / elapsed:.0f} messages/s,"
        f" {d['stage_runs'] / elapsed:.0f} stage runs/s"
    )
    stored = conn.execute("SELECT count(*), sum(total) FROM docpipe.invoices").fetchone()
    assert stored is not None
    say(f"docpipe.invoices: {stored[0]} rows stored, total EUR {stored[1] or 0:,.2f}")
    reasons = conn.execute(
        "SELECT stage, regexp_replace(coalesce(state->>'dispatch_error', state->>'error',"
        " status), '[0-9]+', 'N', 'g'), count(*)"
        " FROM pepsi.workqueue WHERE workqueue_id BETWEEN %s AND %s"
        " AND status <> 'done' GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 5",
        (first, last),
    ).fetchall()
    if reasons:
        say("failures (first reasons):")
        for stage, reason, n in reasons:
            say(f"  {n:>5} x [{stage}] {reason}")


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m pepsi_dispatch.devtools.demo [--messages N] [--timeout S]``."""
    parser = argparse.ArgumentParser(
        prog="python -m pepsi_dispatch.devtools.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--messages", type=int, default=3000, help="documents to enqueue")
    parser.add_argument("--timeout", type=float, default=180, help="seconds until giving up")
    args = parser.parse_args(argv)
    dsn = os.environ.get("PEPSI_DSN")
    if not dsn:
        print(
            "demo: PEPSI_DSN is not set; run 'make demo' (it sets up a database)", file=sys.stderr
        )
        return 2
    if args.messages < 1:
        parser.error("--messages must be positive")
    return run_demo(dsn, args.messages, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
