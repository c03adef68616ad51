"""The endurance run: steady load at about half capacity for a long time, then bounds.

    python tests/endurance/run.py [--minutes M] [--warmup W] [--window S] [--sample S]
                                  [--rate R] [--keep]

Environment: ``ENDURANCE_MINUTES`` (default 30; 120 is the long mode),
``ENDURANCE_WARMUP`` (minutes ignored by the flatness bounds, default 5, 15
for runs of an hour or more), ``ENDURANCE_WINDOW`` (latency
window, seconds, default 60), ``ENDURANCE_SAMPLE`` (seconds between samples,
default 60), ``ENDURANCE_RATE`` (messages/s; default: half the measured
capacity).

What runs: a throwaway PostgreSQL cluster (pepsi_dispatch.devtools.embedded,
durable settings), one dispatcher at shipped settings except RETENTION = 1 min
(so purge runs; short runs set ``--retention`` and ``--poll``, POLL_INTERVAL),
a 3-stage SDK pipeline (tests/endurance/stage.py) with
failures, stage pauses, automatic retries (RETRY_DELAY at ``a``) and delayed
messages in the load, and pepsi-httpd scraped every 5 s. First a calibration
drain measures capacity; then the load runs for the duration.

Sampled each ``--sample``: RSS and open fds of the dispatcher, of its workers
(per worker) and of pepsi-httpd; dead tuples, table and index size of
pepsi.workqueue; the size of every pepsi table and index (written to
``sizes.csv`` in the work directory) and the rows kept in pepsi.dead_letters.
Failed messages are kept (never purged), done ones purged at RETENTION.
Per window: enqueue->start p50/p99 (first run at ``a``).
At the end the load stops, the queue drains, and every message is accounted
for: present and terminal as its kind says, or finished by ``c`` and purged.

Bounds (exit 1 when one breaks, after the table):
  * the claim's and the finish's plans (tests/endurance/plans.py, probed each sample in a
    new session) are at the end what they were at the warm-up's end, and their shared
    buffers at most 1.3 x the warm-up's largest (+32);
  * after the warm-up, dispatcher RSS and fds, per-worker RSS and httpd RSS
    stay within 10 % of their median (max - min <= 10 % of it; fds +-2 allowed);
  * latency: no upward trend -- the last window's p50 is at most 1.5 x the
    first post-warm-up window's (+20 ms), its p99 at most 2 x (+50 ms);
  * workqueue size (table + indexes) at the end at most 1.5 x its largest
    sample at the end of the warm-up (+1 MB), dead tuples at most 2 x (+5,000);
  * every pepsi table and index at the end at most 1.3 x its largest size
    during the warm-up (+64 kB); pepsi.dead_letters and the history tables
    (attempts, tracebacks), which grow with the failed rows kept, at most
    1.3 x their bytes per kept row;
  * every /metrics scrape answered 200; every message accounted for.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from pepsi_dispatch.devtools import embedded  # noqa: E402

sys.path.insert(0, str(HERE))
import plans  # noqa: E402

VENV_BIN = ROOT / ".venv" / "bin"
KINDS = [("ok", 0.86), ("fail", 0.03), ("pause", 0.03), ("crash", 0.03), ("delayed", 0.05)]


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def proc_rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def proc_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def fds_flat(vals: list[int], window: int = 15, slack: int = 2) -> tuple[bool, str]:
    """A leak raises the floor: the fewest descriptors in the last ``window`` samples
    are at most the fewest in the first ``window`` (plus ``slack``). Peaks are not
    a leak: each worker being replaced holds its pipes for a moment beside its
    successor's, so a sample may see one or two workers more."""
    first, last = min(vals[:window]), min(vals[-window:])
    text = (
        f"{min(vals)}..{max(vals)}, fewest {first} in the first {window} samples,"
        f" {last} in the last"
    )
    return last <= first + slack, text


def quantile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="pepsi-endurance-"))
        os.chmod(self.tmp, 0o755)
        self.logdir = self.tmp / "log"
        self.logdir.mkdir()
        os.chmod(self.logdir, 0o777)
        self.enqueued: dict[int, str] = {}  # id -> kind
        self.scrapes = [0, 0]  # ok, failed
        self.stop_load = threading.Event()
        self.stop_scrape = threading.Event()
        self.procs: list[subprocess.Popen] = []

    # -- set-up ---------------------------------------------------------------------
    def setup(self) -> None:
        self.dsn = embedded.start(self.tmp / "pg", "pepsi")
        env = {**os.environ, "PEPSI_DSN": self.dsn}
        subprocess.run(
            [sys.executable, "-m", "alembic", "upgrade", "head"],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
        )
        program = f"{VENV_BIN / 'python'} {HERE / 'stage.py'}"
        self.conf = self.tmp / "pepsi.conf"
        self.conf.write_text(
            "[pepsi-dispatch]\nSERVICE_USER = root\n"
            f"RETENTION = {self.args.retention:g} s\nPOLL_INTERVAL = {self.args.poll:g} s\n\n"
            f"[stage-a]\nPROGRAM = {program}\nNEXT = b\nRETRY_DELAY = 1 s\n"
            "RETRY_DELAY_MAX = 5 s\nMAX_RETRIES = 3\n\n"
            f"[stage-b]\nPROGRAM = {program}\nNEXT = c\n\n"
            f"[stage-c]\nPROGRAM = {program}\n"
        )
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        denv = {**env, "ENDURANCE_LOG": str(self.logdir)}
        self.dispatcher = self._spawn(
            [str(VENV_BIN / "pepsi-dispatch"), "-c", str(self.conf), "serve"], "dispatcher", denv
        )
        self.httpd = self._spawn(
            [str(VENV_BIN / "pepsi-httpd"), "--listen", "127.0.0.1:0"], "httpd", env
        )
        self.port = self._wait_port()

    def _spawn(self, cmd: list[str], name: str, env: dict[str, str]) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115
        p = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
        )
        self.procs.append(p)
        return p

    def _wait_port(self) -> int:
        import re

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", self._log("httpd"))
            if m:
                return int(m.group(1))
            time.sleep(0.1)
        raise SystemExit("pepsi-httpd did not start:\n" + self._log("httpd"))

    def _log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    # -- load -----------------------------------------------------------------------
    def enqueue(self, n: int, mix: bool) -> None:
        kinds = (
            random.choices([k for k, _ in KINDS], [w for _, w in KINDS], k=n) if mix else ["ok"] * n
        )
        now = time.time()
        plain = [k for k in kinds if k != "delayed"]
        if plain:
            ids = self.conn.execute(
                "SELECT pepsi.enqueue_many('a', %s::jsonb[])",
                ([Jsonb({"kind": k, "t": now}) for k in plain],),
            ).fetchall()
            for (i,), k in zip(ids, plain, strict=True):
                self.enqueued[i] = k
        for _ in range(len(kinds) - len(plain)):
            delay = random.uniform(2, 10)
            (i,) = self.conn.execute(
                "SELECT pepsi.enqueue('a', %s, now() + make_interval(secs => %s))",
                (Jsonb({"kind": "delayed", "t": now + delay}), delay),
            ).fetchone()
            self.enqueued[i] = "delayed"

    def calibrate(self) -> float:
        """Messages per second the pipeline drains (a backlog of 'ok' messages)."""
        n = 3000
        self.enqueue(n, mix=False)
        t0 = time.monotonic()
        while self._open_count() > 0:
            if time.monotonic() - t0 > 600:
                raise SystemExit("calibration did not drain in 10 minutes")
            time.sleep(0.2)
        return n / (time.monotonic() - t0)

    def _open_count(self) -> int:
        return self.conn.execute(
            "SELECT count(*) FROM pepsi.workqueue WHERE status IN ('pending', 'running', 'paused')"
        ).fetchone()[0]

    def load(self, rate: float) -> None:
        carry, tick = 0.0, 0.1
        nxt = time.monotonic()
        while not self.stop_load.is_set():
            carry += rate * tick
            n, carry = int(carry), carry - int(carry)
            if n:
                self.enqueue(n, mix=True)
            nxt += tick
            self.stop_load.wait(max(0.0, nxt - time.monotonic()))

    def scrape(self) -> None:
        while not self.stop_scrape.wait(5):
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/metrics", timeout=10
                ) as r:
                    r.read()
                    self.scrapes[0 if r.status == 200 else 1] += 1
            except OSError:
                self.scrapes[1] += 1

    # -- samples --------------------------------------------------------------------
    def sample(self, t: float) -> dict[str, Any]:
        dpid = self.dispatcher.pid
        workers = children(dpid)
        wrss = [proc_rss_kb(p) for p in workers]
        row = self.conn.execute(
            "SELECT n_dead_tup, n_live_tup, pg_table_size('pepsi.workqueue'),"
            " pg_indexes_size('pepsi.workqueue') FROM pg_stat_user_tables"
            " WHERE schemaname = 'pepsi' AND relname = 'workqueue'"
        ).fetchone()
        rels = dict(
            self.conn.execute(
                "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class AS c"
                " WHERE c.relnamespace = 'pepsi'::regnamespace AND c.relkind IN ('r', 'i')"
            ).fetchall()
        )
        kept = self.conn.execute("SELECT count(*) FROM pepsi.dead_letters").fetchone()[0]
        self._write_sizes(t, rels, kept)
        probed = plans.probe_new_session(self.dsn, "a")
        self._write_plans(t, probed)
        return {
            "plans": probed,
            "rels": rels,
            "kept": kept,
            "t": t,
            "disp_rss": proc_rss_kb(dpid),
            "disp_fds": proc_fds(dpid),
            "workers": len(workers),
            "worker_rss": round(statistics.mean(wrss)) if wrss else 0,
            "worker_fds": max((proc_fds(p) for p in workers), default=0),
            "httpd_rss": proc_rss_kb(self.httpd.pid),
            "httpd_fds": proc_fds(self.httpd.pid),
            "dead": row[0],
            "live": row[1],
            "table_kb": row[2] // 1024,
            "index_kb": row[3] // 1024,
        }

    def _write_sizes(self, t: float, rels: dict[str, int], kept: int) -> None:
        """One CSV line per sample: minute, kept rows, every relation's bytes."""
        path = self.tmp / "sizes.csv"
        names = sorted(rels)
        if not path.exists():
            path.write_text(",".join(["minute", "dead_letters_rows", *names]) + "\n")
        with path.open("a") as f:
            f.write(",".join([f"{t / 60:.1f}", str(kept), *(str(rels[n]) for n in names)]) + "\n")

    def _write_plans(self, t: float, probed: dict[str, plans.Probe]) -> None:
        """One CSV line per sample: minute, then each function's buffers and plan shapes."""
        path = self.tmp / "plans.csv"
        if not path.exists():
            path.write_text("minute,function,buffers,rows,shapes\n")
        with path.open("a") as f:
            for name, p in probed.items():
                f.write(f'{t / 60:.1f},{name},{p.buffers},{p.rows},"{" | ".join(p.shapes)}"\n')

    def latencies(self) -> dict[int, float]:
        """id -> enqueue->start seconds of every first run at ``a`` so far."""
        out = {}
        for f in self.logdir.glob("lat-*.txt"):
            for line in f.read_text().splitlines():
                parts = line.split()
                if len(parts) == 2:
                    out[int(parts[0])] = float(parts[1])
        return out

    # -- the run --------------------------------------------------------------------
    def main(self) -> int:
        a = self.args
        print(
            f"endurance: {a.minutes:g} min, warm-up {a.warmup:g} min, samples every {a.sample:g} s,"
            f" latency windows of {a.window:g} s; work dir {self.tmp}",
            flush=True,
        )
        self.setup()
        if a.rate:
            rate = a.rate
            print(f"load {rate:.0f} msg/s (ENDURANCE_RATE; no calibration)", flush=True)
        else:
            capacity = self.calibrate()
            rate = capacity / 2
            print(f"capacity {capacity:.0f} msg/s (3000-message drain); load {rate:.0f} msg/s")
        calibration_ids = set(self.enqueued)
        loader = threading.Thread(target=self.load, args=(rate,), daemon=True)
        scraper = threading.Thread(target=self.scrape, daemon=True)
        t0 = time.monotonic()
        loader.start()
        scraper.start()
        samples, windows = [], []
        lat_by_id: dict[int, float] = {}
        next_sample, next_window = t0 + a.sample, t0 + a.window
        end = t0 + a.minutes * 60
        while time.monotonic() < end:
            time.sleep(1)
            if self.dispatcher.poll() is not None:
                print("the dispatcher exited:\n" + self._log("dispatcher")[-3000:])
                return 1
            now = time.monotonic()
            if now >= next_sample:
                s = self.sample(now - t0)
                samples.append(s)
                print(
                    f"  sample at {s['t'] / 60:5.1f} min: dispatcher {s['disp_rss']} kB"
                    f" {s['disp_fds']} fds, {s['workers']} workers, dead {s['dead']}",
                    flush=True,
                )
                next_sample += a.sample
            if now >= next_window or now >= end:
                new = {i: v for i, v in self.latencies().items() if i not in calibration_ids}
                cur = [v for i, v in new.items() if i not in lat_by_id]
                lat_by_id.update(new)
                windows.append((now - t0, len(cur), quantile(cur, 0.5), quantile(cur, 0.99)))
                next_window += a.window
        self.stop_load.set()
        loader.join(30)
        drained = self.drain()
        final = self.sample(time.monotonic() - t0)
        self.stop_scrape.set()
        verdicts = self.report(samples, windows, final, drained)
        self.shutdown()
        return 0 if all(ok for _, ok in verdicts) else 1

    def drain(self) -> bool:
        deadline = time.monotonic() + 120
        while self._open_count() > 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        return self._open_count() == 0

    def accounting(self) -> tuple[bool, str]:
        done_logged: dict[int, int] = {}
        for f in self.logdir.glob("done-*.txt"):
            for line in f.read_text().split():
                done_logged[int(line)] = done_logged.get(int(line), 0) + 1
        rows = dict(self.conn.execute("SELECT workqueue_id, status FROM pepsi.messages").fetchall())
        bad = []
        for i, kind in self.enqueued.items():
            status = rows.get(i)
            want = "failed" if kind == "fail" else "done"
            if status is None and want == "done" and i in done_logged:
                continue  # finished and purged by RETENTION
            if status != want:
                bad.append((i, kind, status))
        purged = sum(1 for i in self.enqueued if i not in rows)
        twice = sum(1 for n in done_logged.values() if n > 1)
        text = (
            f"{len(self.enqueued)} enqueued: {len(self.enqueued) - len(bad)} as expected"
            f" ({purged} purged after done), {len(bad)} not, {twice} finished twice"
        )
        if bad:
            text += f"; first: {bad[:5]}"
        return not bad and twice == 0, text

    def report(self, samples, windows, final, drained) -> list[tuple[str, bool]]:
        a = self.args
        print("\nsamples (RSS in kB):")
        cols = [
            "t",
            "disp_rss",
            "disp_fds",
            "workers",
            "worker_rss",
            "worker_fds",
            "httpd_rss",
            "httpd_fds",
            "live",
            "dead",
            "table_kb",
            "index_kb",
        ]
        print(" ".join(f"{c:>10}" for c in cols))
        for s in [*samples, final]:
            print(
                " ".join(
                    f"{(s[c] / 60 if c == 't' else s[c]):>10.1f}"
                    if c == "t" or isinstance(s[c], float)
                    else f"{s[c]:>10}"
                    for c in cols
                )
            )
        print("\nenqueue->start at a (first run), per window:")
        print(f"{'until min':>10} {'n':>8} {'p50 ms':>9} {'p99 ms':>9}")
        for t, n, p50, p99 in windows:
            print(f"{t / 60:>10.1f} {n:>8} {p50 * 1000:>9.1f} {p99 * 1000:>9.1f}")
        verdicts: list[tuple[str, bool]] = []
        steady = [s for s in samples if s["t"] >= a.warmup * 60]
        for key, slack in (("disp_rss", 0), ("disp_fds", 2), ("worker_rss", 0), ("httpd_rss", 0)):
            vals = [s[key] for s in steady if s[key]]
            if len(vals) < 2:
                verdicts.append((f"{key}: too few samples after the warm-up to judge", True))
                continue
            if key == "disp_fds":
                ok, text = fds_flat(vals, slack=slack)
                verdicts.append((f"disp_fds no leak: {text}", ok))
                continue
            med = statistics.median(vals)
            ok = max(vals) - min(vals) <= 0.10 * med + slack
            verdicts.append(
                (f"{key} flat within 10 %: {min(vals)}..{max(vals)} (median {med})", ok)
            )
        post = [w for w in windows if w[0] > a.warmup * 60 and w[1] > 0]
        if len(post) >= 2:
            first, last = post[0], post[-1]
            ok = last[2] <= 1.5 * first[2] + 0.02 and last[3] <= 2 * first[3] + 0.05
            verdicts.append(
                (
                    f"latency no upward trend: p50 {first[2] * 1000:.1f} -> "
                    f"{last[2] * 1000:.1f} ms, p99 {first[3] * 1000:.1f} -> "
                    f"{last[3] * 1000:.1f} ms",
                    ok,
                )
            )
        else:
            verdicts.append(("latency trend: fewer than 2 windows after the warm-up", True))
        warm = [s for s in samples if s["t"] <= a.warmup * 60] or samples[:1]
        if warm:
            size0 = max(s["table_kb"] + s["index_kb"] for s in warm)
            dead0 = max(s["dead"] for s in warm)
            size1 = final["table_kb"] + final["index_kb"]
            verdicts.append(
                (
                    f"workqueue size bounded: {size0} kB at the warm-up, {size1} kB at the end",
                    size1 <= 1.5 * size0 + 1024,
                )
            )
            verdicts.append(
                (
                    f"dead tuples bounded: {dead0} at the warm-up, {final['dead']} at the end",
                    final["dead"] <= 2 * dead0 + 5000,
                )
            )
        verdicts += self.relation_bounds(warm, steady, final)
        verdicts += self.plan_bounds(warm, [*steady, final])
        verdicts.append(
            (
                f"/metrics scrapes: {self.scrapes[0]} answered 200, {self.scrapes[1]} not",
                self.scrapes[1] == 0,
            )
        )
        verdicts.append(("queue drained after the load", drained))
        verdicts.append(self.accounting()[::-1])
        print("\nbounds:")
        for text, ok in verdicts:
            print(f"  {'ok  ' if ok else 'FAIL'} {text}")
        return verdicts

    def relation_bounds(
        self, warm: list[dict], steady: list[dict], final: dict
    ) -> list[tuple[str, bool]]:
        """Every pepsi table and index after the warm-up: at most 30 % over its largest
        size during the warm-up (+64 kB for the tiny ones); dead_letters and its
        indexes grow with the rows kept, so per kept row."""
        print(f"\nrelation sizes (kB; every sample in {self.tmp / 'sizes.csv'}):")
        print(f"{'relation':<34} {'warm-up max':>12} {'end':>10} {'growth':>8}")
        out = []
        for name in sorted(final["rels"]):
            before = max(s["rels"].get(name, 0) for s in warm)
            after = final["rels"][name]
            if name.startswith(("dead_letters", "attempts", "tracebacks")):  # kept rows' own
                # Per kept row, from the first sample that had kept rows moved.
                ref = next((s for s in [*warm, *steady] if s["kept"]), final)
                per0 = ref["rels"].get(name, 0) / max(1, ref["kept"])
                per1 = after / max(1, final["kept"])
                ok = per1 <= 1.3 * per0 + 64
                text = f"{name}: {per0:.0f} -> {per1:.0f} bytes per kept row"
            else:
                ok = after <= 1.3 * before + 64 * 1024
                text = f"{name}: {before // 1024} -> {after // 1024} kB"
            growth = (after - before) / before * 100 if before else 0.0
            print(f"{name:<34} {before // 1024:>12} {after // 1024:>10} {growth:>7.0f}%")
            out.append((f"size settles (<= +30 % after the warm-up) {text}", ok))
        return out

    def plan_bounds(self, warm: list[dict], later: list[dict]) -> list[tuple[str, bool]]:
        """The claim's and the finish's plans at the end are the warm-up's, and
        their buffers (the median of the last five probes) at most 30 % over the
        warm-up's largest (+32 buffers); each probe plans anew, in a new session."""
        out = []
        print("\nplans (shared buffers per probe of a 16-row batch; every probe in plans.csv):")
        for name in ("claim_lines", "finish_many"):
            ref, last = warm[-1]["plans"][name], later[-1]["plans"][name]
            warm_max = max(s["plans"][name].buffers for s in warm)
            end = statistics.median(s["plans"][name].buffers for s in later[-5:])
            print(f"  {name}: warm-up max {warm_max}, end (median of last 5) {end:g}")
            out.append(
                (
                    f"{name} plan unchanged since the warm-up ({len(last.shapes)} statements)",
                    last.shapes == ref.shapes,
                )
            )
            out.append(
                (
                    f"{name} cost settles: {warm_max} buffers at the warm-up, {end:g} at the end",
                    end <= 1.3 * warm_max + 32,
                )
            )
        return out

    def shutdown(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
        embedded.stop(self.tmp / "pg")
        if not self.args.keep:
            shutil.rmtree(embedded.cluster_home(self.tmp / "pg"), ignore_errors=True)
            shutil.rmtree(self.tmp, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    minutes = env_float("ENDURANCE_MINUTES", 30)
    p.add_argument("--minutes", type=float, default=minutes)
    p.add_argument(
        "--warmup", type=float, default=env_float("ENDURANCE_WARMUP", 15 if minutes >= 60 else 5)
    )
    p.add_argument("--window", type=float, default=env_float("ENDURANCE_WINDOW", 60))
    p.add_argument("--sample", type=float, default=env_float("ENDURANCE_SAMPLE", 60))
    p.add_argument("--rate", type=float, default=env_float("ENDURANCE_RATE", 0))
    p.add_argument("--retention", type=float, default=60.0, help="RETENTION, seconds (60)")
    p.add_argument(
        "--poll", type=float, default=30.0, help="POLL_INTERVAL (the heartbeat), seconds (30)"
    )
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    run = Run(p.parse_args())
    try:
        return run.main()
    except BaseException:
        run.shutdown()
        raise


if __name__ == "__main__":
    sys.exit(main())
