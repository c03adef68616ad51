#!/usr/bin/env python3
"""Chaos stage ``a``: the pipe protocol spoken by hand, SQL API through raw psycopg.

Reads ids on stdin, answers one line each. For each id it logs to
``$CHAOS_LOG/a-PID-STARTTIME.jsonl`` (O_APPEND, one JSON object per line): ``start``,
``tx`` (the transition, what it returned: true, false, or null when the
statement raised) and ``end``. The work is a sleep; then ``pepsi.advance`` to
``b`` with the dispatcher id as fencing token. A payload ``{"pause": true}``
pauses the row once for a second first; ``{"fail": true}`` fails it.
SIGTERM: finish the message in hand, answer it, exit.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time

import psycopg

STAGE = os.environ["PEPSI_STAGE"]
DID = int(os.environ["PEPSI_DISPATCHER_ID"]) if os.environ.get("PEPSI_DISPATCHER_ID") else None


def process_key() -> str:
    """``STAGE-PID-STARTTIME``: one name per process, though a long soak reuses pids."""
    with open("/proc/self/stat") as f:
        start = f.read().rsplit(")", 1)[1].split()[19]
    return f"{STAGE}-{os.getpid()}-{start}"


PROC = process_key()
LOG = os.open(
    os.path.join(os.environ["CHAOS_LOG"], f"{PROC}.jsonl"),
    os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    0o644,
)
WORK = (
    float(os.environ.get("CHAOS_WORK_MIN", "0.05")),
    float(os.environ.get("CHAOS_WORK_MAX", "0.4")),
)
stopping = False


def log(kind: str, mid: int, **kw) -> None:
    rec = {
        "ev": kind,
        "id": mid,
        "stage": STAGE,
        "pid": os.getpid(),
        "proc": PROC,
        "did": DID,
        "t": time.time(),
    }
    rec.update(kw)
    os.write(LOG, (json.dumps(rec) + "\n").encode())


def on_term(signum, frame):
    global stopping
    stopping = True


def connect() -> psycopg.Connection:
    deadline = time.monotonic() + 30
    while True:
        try:
            return psycopg.connect(
                os.environ["PEPSI_DSN"],
                autocommit=True,
                application_name=f"chaos-worker {STAGE}",
                connect_timeout=5,
            )
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def main() -> int:
    signal.signal(signal.SIGTERM, on_term)
    conn = connect()
    for line in sys.stdin:
        line = line.strip()
        if not line.isdigit():
            print(f"2 bad id line {line!r}", flush=True)
            continue
        mid = int(line)
        log("start", mid)
        for _attempt in range(5):
            try:
                row = conn.execute(
                    "SELECT payload, retries FROM pepsi.workqueue WHERE workqueue_id = %s", (mid,)
                ).fetchone()
                payload, retries = row if row else ({}, 0)
                time.sleep(random.uniform(*WORK))
                if payload.get("fail"):
                    fn, sql, args = (
                        "fail",
                        "SELECT pepsi.fail(%s, %s, %s, %s)",
                        (mid, STAGE, "asked to", DID),
                    )
                elif payload.get("pause") and retries == 0:
                    fn = "pause"
                    sql = "SELECT pepsi.pause(%s, %s, now() + interval '1 second', 'once', %s)"
                    args = (mid, STAGE, DID)
                else:
                    fn, sql, args = (
                        "advance",
                        "SELECT pepsi.advance(%s, %s, 'b', %s)",
                        (mid, STAGE, DID),
                    )
                ret = conn.execute(sql, args).fetchone()[0]
                log("tx", mid, fn=fn, ret=ret)
                answer = (
                    ("0" if fn != "fail" else "1 failed as asked") if ret else f"1 {fn} refused"
                )
                break
            except psycopg.OperationalError as exc:
                log("tx", mid, fn="?", ret=None, error=str(exc).split("\n")[0])
                try:
                    conn.close()
                except Exception:
                    pass
                conn = connect()
        else:
            answer = "1 gave up after 5 connection errors"
        log("end", mid)
        print(answer, flush=True)
        if stopping:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
