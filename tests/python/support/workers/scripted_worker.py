"""A test stage program in plain Python + psycopg (no pepsi SDK), driven by the payload.

Started by the dispatcher as ``PROGRAM [-c CONFIG_FILE] worker`` where PROGRAM is e.g.
``/abs/.venv/bin/python /abs/tests/python/support/workers/scripted_worker.py --log FILE
--next a=b``.
It reads workqueue ids from stdin, one per line, and answers each with one line.

What it does with a message is read from the row's payload:
``{"do": ACTIONS}`` or, for one stage only, ``{"do_STAGE": ACTIONS}`` (wins over "do").
ACTIONS is a list, or a string of actions separated by ";". Actions run in order:

  next               advance to this stage's successor (from --next STAGE=SUCC), else finish
  finish             pepsi.finish, answer 0
  advance:STAGE      pepsi.advance to STAGE, answer 0
  fail               answer "3 scripted failure" (non-zero answer; the row stays running)
  sqlfail            pepsi.fail(..., 'scripted'), answer 0
  exit:N             exit with code N without answering (crash)
  segv               kill itself with SIGSEGV (crash by signal)
  fork_exit:N        fork a child that keeps stdout/stderr open for 30 s, then exit N
  hang               sleep forever without answering
  garbage            answer a line that is not a protocol answer
  leave_running      answer 0 without any transition
  pause:SECONDS      pepsi.pause until now()+SECONDS, answer 0
  pause_once:SECONDS pause while the row's retries are 0, else act as "next"
  until:N:ACTION     ACTION (e.g. fail, exit:3) while the row's retries are below N,
                     else act as "next" (automatic retries)
  sleep:SECONDS      sleep, then go on with the next action
  sleep_first:SECONDS
                     sleep as "sleep" on the id's first run only (no earlier START
                     of it in --log, by any worker); on a later run go on at once
  stderr_flood:BYTES write BYTES of stderr lines, then go on
  stderr_noline:BYTES write one stderr line of BYTES bytes, then go on
  split_answer       write this message's answer line in two pieces, 0.2 s apart
  fuse:B[,C]         finish the row and answer "0 fused=B[,C]"
The default (no "do") is "next".

Every message is logged to --log FILE (appended, one line each, so it survives kill -9):
  START <id> <pid> <stage> <time_ns>    before any work on the message
  END <id> <pid> <stage> <time_ns>      after the transition committed, before answering
  RECV <id> <pid> <stage> <time_ns>     when the id was read from stdin
  ANSWER <id> <pid> <stage> <time_ns>   logged after its answer was written, stamped just
                                        before the write began: the dispatcher can only act on
                                        the answer after that moment, so a second worker's RECV
                                        never precedes it (a stamp taken after the write could,
                                        when this process is descheduled between the two)
  QUEUE <pid> <n>                       n = ids written to this worker but not yet answered
                                        (sampled just before each answer, when it is largest)
  SPAWN <pid> <stage> <dispatcher_id> <argv...> / EXIT <pid> <reason>
  ROW <id> <pid> <hex>                  with --take-rows: an input line that carried its row
                                        (the line's bytes in hex), logged with its RECV
time_ns is CLOCK_MONOTONIC (one clock for all processes of the machine).
"""

from __future__ import annotations

import argparse
import fcntl
import mmap
import os
import signal
import struct
import sys
import time

import psycopg

STAGE = os.environ.get("PEPSI_STAGE", "")
DSN = os.environ.get("PEPSI_DSN", "")
DISPATCHER_ID = (
    int(os.environ["PEPSI_DISPATCHER_ID"]) if os.environ.get("PEPSI_DISPATCHER_ID") else None
)

_log_fd: int | None = None
_log_path: str | None = None


def first_run(wq_id: int) -> bool:
    """Is this run the id's first (its START, just logged, the only one in --log)?"""
    if _log_path is None:
        return True
    prefix = f"START {wq_id} ".encode()
    with open(_log_path, "rb") as f:
        return sum(1 for line in f if line.startswith(prefix)) <= 1


def log(*words: object) -> None:
    if _log_fd is None:
        return
    os.write(_log_fd, (" ".join(str(w) for w in words) + "\n").encode())


class Input:
    """stdin read with os.read, so what the dispatcher has written can be counted."""

    def __init__(self) -> None:
        self.buf = b""
        self.lines: list[bytes] = []
        self.eof = False

    def _take(self, data: bytes) -> None:
        if not data:
            self.eof = True
            return
        self.buf += data
        *complete, self.buf = self.buf.split(b"\n")
        now = time.monotonic_ns()
        for line in complete:
            wq_id = line.partition(b"\t")[0].decode(errors="replace").strip() or "-"
            log("RECV", wq_id, os.getpid(), STAGE, now)
            if b"\t" in line:
                log("ROW", wq_id, os.getpid(), line.hex())
        self.lines.extend(complete)

    def drain(self) -> None:
        """Read whatever is in the pipe without blocking."""
        flags = fcntl.fcntl(0, fcntl.F_GETFL)
        fcntl.fcntl(0, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        try:
            while not self.eof:
                try:
                    data = os.read(0, 65536)
                except BlockingIOError:
                    break
                self._take(data)
        finally:
            fcntl.fcntl(0, fcntl.F_SETFL, flags)

    def next_line(self) -> bytes | None:
        while not self.lines:
            if self.eof:
                return None
            self._take(os.read(0, 65536))
        return self.lines.pop(0)


def answer(inp: Input, wq_id: int, line: str, in_hand: int = 1, split: bool = False) -> None:
    inp.drain()
    log("QUEUE", os.getpid(), len(inp.lines) + in_hand)
    before_write = time.monotonic_ns()
    if split:  # the answer line arrives in two pieces, 0.2 s apart
        sys.stdout.write(line[:1])
        sys.stdout.flush()
        time.sleep(0.2)
        line = line[1:]
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    log("ANSWER", wq_id, os.getpid(), STAGE, before_write)


class DB:
    """One autocommit connection, re-established (for up to a minute) when it is lost,
    so a PostgreSQL restart does not turn into worker crashes. A statement whose
    connection broke is re-run: transitions are guarded, a repeat returns false."""

    def __init__(self) -> None:
        self.conn: psycopg.Connection | None = None

    def query(self, sql: str, params: tuple = ()) -> tuple | None:
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = psycopg.connect(DSN, autocommit=True, connect_timeout=5)
                return self.conn.execute(sql, params).fetchone()
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise
                print(f"scripted_worker: database trouble, retrying: {exc}", file=sys.stderr)
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                time.sleep(0.2)


def actions_for(payload: dict) -> list[str]:
    spec = payload.get(f"do_{STAGE}", payload.get("do", "next"))
    if isinstance(spec, str):
        spec = [s.strip() for s in spec.split(";") if s.strip()]
    return list(spec)


def take_rows() -> None:
    """Say, in the capability word of the in-hand slot the dispatcher offers, that
    this worker takes rows on its pipe (CAN_TAKE_ROWS = 2, the slot's second
    native 64-bit word: pepsi_dispatch/contract.py)."""
    fd = int(os.environ["PEPSI_INHAND_FD"])
    with mmap.mmap(fd, 16) as slot:
        (bits,) = struct.unpack_from("=q", slot, 8)
        struct.pack_into("=q", slot, 8, bits | 2)


def main() -> int:
    global _log_fd, _log_path
    parser = argparse.ArgumentParser()
    parser.add_argument("--log")
    parser.add_argument("--next", action="append", default=[], help="STAGE=SUCCESSOR")
    parser.add_argument(
        "--startup-delay",
        type=float,
        default=0.0,
        help="seconds to sleep before reading stdin (a slow start)",
    )
    parser.add_argument(
        "--take-rows", action="store_true", help="take claimed rows on the pipe (ROW log lines)"
    )
    parser.add_argument("-c", dest="config")
    parser.add_argument("command", nargs="?")
    args = parser.parse_args()
    if args.log:
        _log_fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        _log_path = args.log
    successors = dict(item.split("=", 1) for item in args.next)
    log("SPAWN", os.getpid(), STAGE, DISPATCHER_ID, *sys.argv[1:])
    if args.command != "worker":
        print(
            f"scripted_worker: expected the 'worker' subcommand, got {sys.argv[1:]}",
            file=sys.stderr,
        )
        return 2

    stop = False
    busy = False

    def on_term(signum, frame):  # finish the message in hand, then exit
        nonlocal stop
        if not busy:
            log("EXIT", os.getpid(), "sigterm-idle")
            os._exit(0)
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    if args.take_rows:
        take_rows()

    conn = DB()
    conn.query("SELECT 1")
    time.sleep(args.startup_delay)
    inp = Input()
    while not stop:
        line = inp.next_line()
        if line is None:
            break
        busy = True
        wq_id = int(line.partition(b"\t")[0].strip())
        mono = time.monotonic_ns
        log("START", wq_id, os.getpid(), STAGE, mono())
        row = conn.query(
            "SELECT stage, payload, retries FROM pepsi.workqueue WHERE workqueue_id = %s",
            (wq_id,),
        )
        if row is None:
            answer(inp, wq_id, "4 no such row")
            busy = False
            continue
        _stage, payload, retries = row
        reply = None
        split = False
        for action in actions_for(payload):
            name, _, arg = action.partition(":")
            if name == "until":
                below, _, act = arg.partition(":")
                if retries < int(below):
                    name, _, arg = act.partition(":")
                else:
                    name, arg = "next", ""
            if name == "pause_once":
                if retries == 0:
                    name = "pause"
                else:
                    name, arg = "next", ""
            if name == "next":
                if STAGE in successors:
                    name, arg = "advance", successors[STAGE]
                else:
                    name = "finish"
            if name == "sleep_first":
                if first_run(wq_id):
                    time.sleep(float(arg))
            elif name == "sleep":
                time.sleep(float(arg))
            elif name == "stderr_noline":
                os.write(2, b"y" * int(arg))  # one huge line, newline only at the very end
                os.write(2, b"\n")
            elif name == "split_answer":
                split = True
            elif name == "stderr_flood":
                remaining = int(arg)
                chunk = ("x" * 99 + "\n").encode()
                while remaining > 0:
                    os.write(2, chunk[: min(remaining, len(chunk))])
                    remaining -= len(chunk)
            elif name == "finish":
                ok = conn.query("SELECT pepsi.finish(%s, %s, %s)", (wq_id, STAGE, DISPATCHER_ID))[0]
                reply = "0" if ok else "5 finish returned false"
            elif name == "advance":
                ok = conn.query(
                    "SELECT pepsi.advance(%s, %s, %s, %s)", (wq_id, STAGE, arg, DISPATCHER_ID)
                )[0]
                reply = "0" if ok else "5 advance returned false"
            elif name == "sqlfail":
                conn.query(
                    "SELECT pepsi.fail(%s, %s, 'scripted', %s)", (wq_id, STAGE, DISPATCHER_ID)
                )
                reply = "0"
            elif name == "pause":
                conn.query(
                    "SELECT pepsi.pause(%s, %s, clock_timestamp() + make_interval(secs => %s),"
                    " 'scripted pause', %s)",
                    (wq_id, STAGE, float(arg), DISPATCHER_ID),
                )
                reply = "0"
            elif name == "fuse":
                conn.query("SELECT pepsi.finish(%s, %s, %s)", (wq_id, STAGE, DISPATCHER_ID))
                reply = f"0 fused={arg}"
            elif name == "fail":
                reply = "3 scripted failure"
            elif name == "leave_running":
                reply = "0"
            elif name == "garbage":
                reply = "this is not an answer"
            elif name == "exit":
                log("EXIT", os.getpid(), f"exit:{arg}")
                os._exit(int(arg))
            elif name == "fork_exit":
                # leave a grandchild holding our stdout/stderr open, then exit N
                child = os.fork()
                if child == 0:
                    time.sleep(30)
                    os._exit(0)
                log("GRANDCHILD", os.getpid(), child)
                log("EXIT", os.getpid(), f"fork_exit:{arg}")
                os._exit(int(arg))
            elif name == "segv":
                log("EXIT", os.getpid(), "segv")
                signal.signal(signal.SIGSEGV, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGSEGV)
            elif name == "hang":
                while True:
                    time.sleep(3600)
            else:
                reply = f"6 unknown action {action!r}"
        if reply is None:
            reply = "7 no action answered"
        log("END", wq_id, os.getpid(), STAGE, mono())
        answer(inp, wq_id, reply, split=split)
        busy = False
    log("EXIT", os.getpid(), "eof" if not stop else "sigterm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
