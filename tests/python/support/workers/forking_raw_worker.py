#!/usr/bin/env python3
"""A stage program that speaks the pipe protocol itself (no SDK ``run``) and
calls ``fork_point()`` after its imports, so that the dispatcher may fork its
workers from a template. It finishes every id it reads, one statement per
buffer, and logs ``START``/``END`` lines (see scripted_worker.py) to --log FILE.
With --connect it connects with ``pepsi_dispatch.worker.connect()`` and ends with
``leave(0, conn)`` (sessions passed on), and writes "WORKER_PID BACKEND_PID" to
--sessions FILE when it starts.

Usage: forking_raw_worker.py --log FILE [--connect --sessions FILE] [-c CONFIG] worker
"""

from __future__ import annotations

import os
import sys
import time

import psycopg

from pepsi_dispatch.worker import connect, fork_point, leave

fork_point()  # the template never returns from here; forked workers go on

log_path = sys.argv[sys.argv.index("--log") + 1]
stage = os.environ["PEPSI_STAGE"]
did = int(os.environ["PEPSI_DISPATCHER_ID"])
lending = "--connect" in sys.argv
if lending:
    conn = connect()
    with open(sys.argv[sys.argv.index("--sessions") + 1], "a") as f:
        f.write(f"{os.getpid()} {conn.info.backend_pid}\n")
else:
    conn = psycopg.connect(os.environ["PEPSI_DSN"], autocommit=True)
pid = os.getpid()


def log(lines: list[str]) -> None:
    with open(log_path, "a") as f:
        f.write("".join(lines))


buf = b""
while True:
    chunk = os.read(0, 65536)
    if not chunk:
        break
    buf += chunk
    if b"\n" not in buf:
        continue
    head, _, buf = buf.rpartition(b"\n")
    ids = [int(x) for x in head.split()]
    log([f"START {i} {pid} {stage} {time.time_ns()}\n" for i in ids])
    time.sleep(0.002)
    conn.execute(
        "SELECT count(*) FILTER (WHERE pepsi.finish(x, %s, %s)) FROM unnest(%s::bigint[]) x",
        (stage, did, ids),
    )
    log([f"END {i} {pid} {stage} {time.time_ns()}\n" for i in ids])
    os.write(1, b"0\n" * len(ids))
if lending:
    leave(0, conn)
conn.close()
leave(0)
