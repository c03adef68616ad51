"""``make bench BENCH_ARGS='--scrape 1'``: the drain with and without a /metrics scrape.

Each throughput run of :func:`pepsi_dispatch.devtools.bench.core.throughput` is done twice,
interleaved: alone, and with a pepsi-httpd scraped every SCRAPE seconds for the
whole drain (the httpd is started before the run, so its first scrape is not
in the numbers). Reported side by side: messages/s without and with the
scrape, and the scrape's wall time (p50, p95, max; one GET /metrics each, the
body read in full).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any


class Scraper:
    """A pepsi-httpd on a free port and a thread GETting /metrics every ``every`` seconds."""

    def __init__(self, dsn: str, every: float, workdir: Path) -> None:
        self.every = every
        self.log = workdir / "httpd.log"
        self._log = open(self.log, "ab")  # noqa: SIM115
        httpd = Path(sys.executable).with_name("pepsi-httpd")
        cmd = [str(httpd)] if httpd.exists() else [sys.executable, "-m", "pepsi_dispatch.httpd"]
        self.proc = subprocess.Popen(
            [*cmd, "--listen", "127.0.0.1:0", "-L", "INFO"],
            env={**os.environ, "PEPSI_DSN": dsn},
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while True:
            m = re.search(r"listening on (http://\S+/)", self.log.read_text(errors="replace"))
            if m:
                self.url = m.group(1) + "metrics"
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"bench: pepsi-httpd did not start: {self.log.read_text()}")
            time.sleep(0.05)
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def get(self) -> float:
        t0 = time.perf_counter()
        with urllib.request.urlopen(self.url, timeout=30) as r:
            r.read()
        return time.perf_counter() - t0

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self.times.append(self.get())
            self._stop.wait(max(0.0, self.every - (time.monotonic() - t0)))

    def __enter__(self) -> Scraper:
        self.get()  # warm: connection made, not counted
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.proc.terminate()
        self.proc.wait(10)
        self._log.close()


def compare(dsn: str, args: Any) -> int:
    """Run the throughput bench with and without scraping; print both side by side."""
    from pepsi_dispatch.devtools.bench.core import say, throughput

    workers = args.worker or ["sdk-gc"]
    say(
        f"throughput with and without a /metrics scrape every {args.scrape:g} s:"
        f" {args.messages} messages through {args.stages} no-op stages,"
        f" PARALLELISM={args.parallelism} QUEUE_LIMIT={args.queue_limit}"
    )
    rates: dict[tuple[str, bool], list[float]] = {}
    scrapes: list[float] = []
    for _ in range(args.repeat):
        for worker in workers:
            for scraped in (False, True):
                with tempfile.TemporaryDirectory(prefix="pepsi-bench-httpd-") as tmp:

                    def run(w: str = worker) -> dict[str, float]:
                        return throughput(
                            dsn,
                            w,
                            args.messages,
                            args.stages,
                            args.parallelism,
                            args.queue_limit,
                            args.timeout,
                            live=args.live,
                        )

                    if scraped:
                        with Scraper(dsn, args.scrape, Path(tmp)) as sc:
                            r = run()
                        scrapes.extend(sc.times)
                        extra = f", {len(sc.times)} scrapes"
                    else:
                        r = run()
                        extra = ""
                rates.setdefault((worker, scraped), []).append(r["msg_per_s"])
                say(
                    f"  {worker:<7} {'scraped' if scraped else 'alone  '} {r['elapsed']:7.2f} s"
                    f"  {r['msg_per_s']:8.0f} messages/s (not done {r['failed']}{extra})"
                )
    say(f"  medians of {args.repeat} interleaved run(s):")
    for worker in workers:
        alone = statistics.median(rates[(worker, False)])
        with_scrape = statistics.median(rates[(worker, True)])
        say(
            f"  {worker:<7} alone {alone:8.0f} messages/s   scraped every {args.scrape:g} s"
            f" {with_scrape:8.0f} messages/s   ({(with_scrape / alone - 1) * 100:+.1f} %)"
        )
    if scrapes:
        s = sorted(scrapes)
        say(
            f"  GET /metrics during the drain ({len(s)} scrapes):"
            f" p50 {s[len(s) // 2] * 1000:.1f} ms  p95 {s[int(len(s) * 0.95)] * 1000:.1f} ms"
            f"  max {s[-1] * 1000:.1f} ms"
        )
    return 0
