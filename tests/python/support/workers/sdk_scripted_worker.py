"""A stage program for the SDK tests: each message's payload scripts what its handler does.

payload = {"plan": {STAGE: STEP, ...}} with STEP one of
  {"op": "advance", "to": "b", "fuse": false}   {"op": "finish"}
  {"op": "pause", "seconds": 30, "reason": "..."}  {"op": "fail", "reason": "..."}
  {"op": "raise", "message": "..."}  {"op": "none"}  {"op": "bogus"}  {"op": "exit", "code": 3}
  {"op": "kill"} (SIGKILLs its own process)
  ("raise" with "below": N raises only while msg.retries < N, then finishes)
and optional keys: "print": text (written with print()), "sleep": seconds,
"state": {...} (merged into msg.state), "echo": true (what the handler saw of the
message -- payload, retries, stage, state -- into msg.state["echo"]), "append": value
(appended in place to msg.state["log"]), "unjson": true (a set in msg.state), "nul": true
(a string with a NUL in msg.state: its set_state fails in the database), "insert": text
(row in public.sdk_log through msg.db, in the message's transaction), "session": true
(what the handler found of its database session -- worker pid, backend pid, search_path,
advisory locks held, temporary table, client_connection_check_interval -- into
msg.state["session"], then leaves all three
changed for whoever uses the session next), "end_tx": "commit()" | "rollback()" | SQL
(the handler ends its transaction itself: the connection's commit() or rollback(), or
SQL such as "COMMIT" or "ROLLBACK" run on msg.db, after its "insert"), "swallow": true
(with end_tx: the handler catches what that raises and goes on), "sql_sleep": seconds
(pg_sleep on msg.db, in the message's transaction, after its row was pinned).
Usage: sdk_scripted_worker.py [--group-commit | --default-commit] [--stages a,b,c]
  [--log PATH] [-c CONFIG] worker
"""

from __future__ import annotations

import os
import signal
import sys
import time

from pepsi_dispatch.worker import Advance, Fail, Finish, Message, Pause, run

#: --log PATH: a START and an END line per handler run (tests/python/support/dispatch_harness.py)
LOG: int | None = None


def note(what: str, msg: Message) -> None:
    if LOG is not None:
        os.write(LOG, f"{what} {msg.id} {os.getpid()} {msg.stage} {time.monotonic_ns()}\n".encode())


def handle(msg: Message):
    note("START", msg)
    try:
        return step_of(msg)
    finally:
        note("END", msg)


def step_of(msg: Message):
    step = msg.payload.get("plan", {}).get(msg.stage, {"op": "finish"})
    if "print" in step:
        print(step["print"])
    if "sleep" in step:
        time.sleep(step["sleep"])
    if "sql_sleep" in step:  # a handler stuck in a long statement
        msg.db.execute("SELECT pg_sleep(%s)", (step["sql_sleep"],))
    if step.get("echo"):
        seen = {"payload": msg.payload, "retries": msg.retries, "stage": msg.stage}
        msg.state["echo"] = {**seen, "state": dict(msg.state)}
    if "state" in step:
        msg.state.update(step["state"])
    msg.state.setdefault("seen", [])
    msg.state["seen"] = [*msg.state["seen"], msg.stage]
    if "append" in step:  # mutate a nested value in place
        msg.state.setdefault("log", [])
        msg.state["log"].append(step["append"])
    if step.get("unjson"):
        msg.state["bad"] = {1, 2}
    if step.get("nul"):  # valid JSON, but PostgreSQL's jsonb refuses the NUL
        msg.state["bad"] = "a\x00b"
    if step.get("session"):
        msg.state["session"] = {
            "pid": os.getpid(),
            "backend": msg.db.execute("SELECT pg_backend_pid()").fetchone()[0],
            "search_path": msg.db.execute("SHOW search_path").fetchone()[0],
            "advisory_locks": msg.db.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                " AND pid = pg_backend_pid()"
            ).fetchone()[0],
            "temp_table": msg.db.execute(
                "SELECT to_regclass('pg_temp.lend_probe') IS NOT NULL"
            ).fetchone()[0],
            "client_check": msg.db.execute("SHOW client_connection_check_interval").fetchone()[0],
        }
        msg.db.execute("SET search_path = pg_catalog, public")
        msg.db.execute("SELECT pg_advisory_lock(4242)")
        msg.db.execute("CREATE TEMP TABLE IF NOT EXISTS lend_probe (x int)")
    if "insert" in step:
        msg.db.execute(
            "INSERT INTO public.sdk_log (id, note) VALUES (%s, %s)", (msg.id, step["insert"])
        )
    if "end_tx" in step:  # a handler that ends the transaction it runs in itself
        end_transaction(msg, step["end_tx"], step.get("swallow", False))
    op = step["op"]
    if op == "advance":
        return Advance(step["to"], fuse=step.get("fuse", False))
    if op == "finish":
        return Finish()
    if op == "pause":
        return Pause(step["seconds"], step.get("reason"))
    if op == "fail":
        return Fail(step["reason"])
    if op == "raise":
        if msg.retries >= step.get("below", msg.retries + 1):
            return Finish()
        raise ValueError(step["message"])
    if op == "none":
        return None
    if op == "exit":
        sys.exit(step["code"])
    if op == "kill":  # a death Python cannot see
        os.kill(os.getpid(), signal.SIGKILL)
    if op == "badpause":
        return Pause("soon")
    return "bogus"


def end_transaction(msg: Message, how: str, swallow: bool) -> None:
    """``how``: "commit()" or "rollback()" (the connection's methods), else SQL
    run on msg.db ("COMMIT", "ROLLBACK", "COMMIT; BEGIN", ...). ``swallow``:
    the handler catches what that raises and goes on."""
    conn = msg.db
    try:
        if how == "commit()":
            conn.commit()
        elif how == "rollback()":
            conn.rollback()
        else:
            conn.execute(how)
    except Exception:
        if not swallow:
            raise


if __name__ == "__main__":
    args = sys.argv[1:]
    group = True if "--group-commit" in args else None if "--default-commit" in args else False
    args = [a for a in args if a not in ("--group-commit", "--default-commit")]
    stages = "a,b,c,d"
    if "--log" in args:
        i = args.index("--log")
        LOG = os.open(args[i + 1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        del args[i : i + 2]
    if "--stages" in args:
        i = args.index("--stages")
        stages = args[i + 1]
        del args[i : i + 2]
    run({s: handle for s in stages.split(",")}, group_commit=group, argv=args)
