"""A stage program for the fault tests: misbehaves once, then works.

Usage: fault_worker.py --marker PATH --first ACTION [--wait-for PATH] [-c CONFIG] worker

Reads ids from stdin. For the first id any instance of it reads while PATH
(``--marker``) does not exist, it creates PATH and does ACTION; every other id
is finished with ``pepsi.finish`` and answered ``0``. With ``--wait-for FILE``
ACTION waits until FILE exists first. ACTIONs:

  exit:N     exit with status N without answering
  bignum     answer a line whose number has 5,000 digits
  fused:X,Y  finish the row and answer "0 fused=X,Y"

Its pid and every id it reads are appended to PATH.log (``PID <pid>``, ``ID <id>``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import psycopg


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--marker", required=True)
    parser.add_argument("--first", required=True)
    parser.add_argument("--wait-for")
    parser.add_argument("-c")
    parser.add_argument("mode")
    args = parser.parse_args()
    stage = os.environ["PEPSI_STAGE"]
    did = int(os.environ["PEPSI_DISPATCHER_ID"])
    conn = psycopg.connect(os.environ["PEPSI_DSN"], autocommit=True)
    log = open(args.marker + ".log", "a")  # noqa: SIM115
    log.write(f"PID {os.getpid()}\n")
    log.flush()
    while True:
        line = sys.stdin.readline()
        if not line:
            return 0
        wid = int(line)
        log.write(f"ID {wid}\n")
        log.flush()
        if not os.path.exists(args.marker):
            open(args.marker, "w").close()
            if args.wait_for:
                while not os.path.exists(args.wait_for):
                    time.sleep(0.05)
            action, _, arg = args.first.partition(":")
            if action == "exit":
                os._exit(int(arg))
            if action == "bignum":
                sys.stdout.write("9" * 5000 + " big\n")
                sys.stdout.flush()
                continue
            if action == "fused":
                conn.execute("SELECT pepsi.finish(%s, %s, %s)", (wid, stage, did))
                sys.stdout.write(f"0 fused={arg}\n")
                sys.stdout.flush()
                continue
            raise SystemExit(f"unknown action {args.first}")
        conn.execute("SELECT pepsi.finish(%s, %s, %s)", (wid, stage, did))
        sys.stdout.write("0\n")
        sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
