"""A tiny stage program for the dispatcher's own smoke tests (test_loop_basic.py).

Usage (as PROGRAM): ``python basic_worker.py [--next A=B ...] [--fuse A=B,C]
[--sleep-before-answer STAGE=SECONDS] [--sleep STAGE=SECONDS] [--env-file FILE]
[--startup-delay SECONDS] [--again STAGE] [-c CONFIG] worker``

For each id read from stdin: sleep (``--sleep``), advance the row to the
stage's successor (``--next``) or finish it, sleep again
(``--sleep-before-answer``: the row is already pending at the next stage while
this worker has not answered -- the window in which a late answer must not
hurt the row's next run), then answer ``0`` (or ``0 fused=...`` with
``--fuse``). ``--env-file`` appends the worker's PEPSI_* environment and argv
as one JSON line per start. ``--again STAGE``: the first time this worker
sees an id at STAGE it advances the row to STAGE itself (it runs there once
more), the second time it goes on as usual. ``--pause-first STAGE=SECONDS``:
the first id this worker sees at STAGE is paused that long (requeue_due makes
it pending again, with its low id). ``--sleep-odd STAGE=SECONDS``: sleep that
long before handling an odd id (rows leave the stage out of id order).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import psycopg


def pairs(items: list[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in items)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--next", action="append", default=[])
    parser.add_argument("--fuse", action="append", default=[])
    parser.add_argument("--sleep", action="append", default=[])
    parser.add_argument("--sleep-before-answer", action="append", default=[])
    parser.add_argument("--env-file")
    parser.add_argument("--startup-delay", type=float, default=0.0)
    parser.add_argument("--again", action="append", default=[])
    parser.add_argument("--pause-first", action="append", default=[])
    parser.add_argument("--sleep-odd", action="append", default=[])
    parser.add_argument("-c", dest="config")
    parser.add_argument("command")
    args = parser.parse_args()
    stage = os.environ["PEPSI_STAGE"]
    did = int(os.environ["PEPSI_DISPATCHER_ID"])
    nxt = pairs(args.next).get(stage)
    fuse = pairs(args.fuse).get(stage)
    sleep = float(pairs(args.sleep).get(stage, 0))
    late = float(pairs(args.sleep_before_answer).get(stage, 0))
    pause_first = pairs(args.pause_first).get(stage)
    sleep_odd = float(pairs(args.sleep_odd).get(stage, 0))
    if args.env_file:
        with open(args.env_file, "a") as f:
            env = {k: v for k, v in os.environ.items() if k.startswith("PEPSI_")}
            f.write(json.dumps({"pid": os.getpid(), "argv": sys.argv[1:], "env": env}) + "\n")
    time.sleep(args.startup_delay)  # a slow start-up, before reading any input
    conn = psycopg.connect(os.environ["PEPSI_DSN"], autocommit=True)
    seen: set[int] = set()
    for line in sys.stdin:
        wid = int(line)
        if sleep:
            time.sleep(sleep)
        if sleep_odd and wid % 2:
            time.sleep(sleep_odd)
        if pause_first is not None:
            conn.execute(
                "SELECT pepsi.pause(%s, %s, now() + make_interval(secs => %s), 'test', %s)",
                (wid, stage, float(pause_first), did),
            )
            pause_first = None
        elif stage in args.again and wid not in seen:
            seen.add(wid)
            conn.execute("SELECT pepsi.advance(%s, %s, %s, %s)", (wid, stage, stage, did))
        elif nxt:
            conn.execute("SELECT pepsi.advance(%s, %s, %s, %s)", (wid, stage, nxt, did))
        else:
            conn.execute("SELECT pepsi.finish(%s, %s, %s)", (wid, stage, did))
        if late:
            time.sleep(late)
        sys.stdout.write(f"0 fused={fuse}\n" if fuse else "0\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
