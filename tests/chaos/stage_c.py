#!/usr/bin/env python3
"""Chaos stage ``c``: the Python SDK (pepsi_dispatch.worker.run), finishing each message.

Logs ``start`` from the handler, and ``tx``/``end`` from a wrapper around the
SDK's transition call, ``pepsi_dispatch.sdk.transaction.Scope.write`` (what the
fencing-guarded statement returned), to ``$CHAOS_LOG/c-PID.jsonl``.
"""

from __future__ import annotations

import json
import os
import random
import time

from pepsi_dispatch.sdk import transaction
from pepsi_dispatch.worker import Finish, run

STAGE = os.environ.get("PEPSI_STAGE", "c")
DID = int(os.environ["PEPSI_DISPATCHER_ID"]) if os.environ.get("PEPSI_DISPATCHER_ID") else None
LOG = os.open(
    os.path.join(os.environ["CHAOS_LOG"], f"{STAGE}-{os.getpid()}.jsonl"),
    os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    0o644,
)


def log(kind: str, mid: int, **kw) -> None:
    rec = {"ev": kind, "id": mid, "stage": STAGE, "pid": os.getpid(), "did": DID, "t": time.time()}
    rec.update(kw)
    os.write(LOG, (json.dumps(rec) + "\n").encode())


_orig_write = getattr(getattr(transaction, "Scope", None), "write", None)

if _orig_write is not None:

    def _write(self, statement, *args, **kw):
        mid, kind = statement.message_id, statement.kind
        try:
            _orig_write(self, statement, *args, **kw)
        except transaction.RowLost:
            log("tx", mid, fn=kind, ret=False)
            log("end", mid)
            raise
        except Exception as exc:
            log("tx", mid, fn=kind, ret=None, error=type(exc).__name__)
            raise
        log("tx", mid, fn=kind, ret=True)
        log("end", mid)

    transaction.Scope.write = _write


def handle(msg):
    log("start", msg.id)
    time.sleep(random.uniform(0.02, 0.2))
    return Finish()


run({STAGE: handle})
