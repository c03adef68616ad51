"""An SDK stage for the pooler test: records each run in ``public.pool_ran`` in the
message's own transaction, then advances to the stage named by ``--next`` (or finishes).

payload keys: ``"crash": true`` makes the handler kill its worker (exit 3) mid-transaction;
``"flaky": "STAGE"`` at this stage raises while ``msg.retries`` is 0 (an automatic retry
then succeeds).
Usage: pooled_sdk_stage.py [--next STAGE] [-c CONFIG] worker
"""

from __future__ import annotations

import os
import sys

from pepsi_dispatch.worker import Advance, Finish, Message, run

NEXT: str | None = None


def handle(msg: Message) -> Advance | Finish:
    """Record the run, then crash, fail once or move on as the payload says."""
    msg.db.execute(
        "INSERT INTO public.pool_ran (id, stage, retries, worker_pid, backend_pid)"
        " VALUES (%s, %s, %s, %s, pg_backend_pid())",
        (msg.id, msg.stage, msg.retries, os.getpid()),
    )
    if msg.payload.get("crash"):
        os._exit(3)
    if msg.payload.get("flaky") == msg.stage and msg.retries == 0:
        raise RuntimeError("flaky: fails on its first run")
    return Advance(NEXT) if NEXT else Finish()


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--next" in args:
        i = args.index("--next")
        NEXT = args[i + 1]
        del args[i : i + 2]
    run({os.environ.get("PEPSI_STAGE", "py"): handle}, argv=args)
