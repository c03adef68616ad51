#!/usr/bin/env python3
"""Chaos stage ``c``: the Python SDK (pepsi_dispatch.worker.run), finishing each message
at the SDK's defaults (group commit; its workers are forked by the stage's template process).

Logs ``start`` from the handler, and ``tx``/``end`` from wrappers around the
SDK's transition call, ``pepsi_dispatch.sdk.transaction.Scope.write`` (what the
fencing-guarded statement returned), to ``$CHAOS_LOG/c-PID-STARTTIME.jsonl``. Under group
commit (the SDK's default with the dispatcher's in-hand slot) a transition is
logged as applied only when its batch commits (``GroupBatch.commit``).
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
#: pid -> (its process key, its log file): opened by the process that logs, not at
#: import, because a worker forked by the stage's template process imported this
#: module in the template; the soak's watcher finds each worker by the pid and
#: start time in its file's name (``STAGE-PID-STARTTIME``: a long soak reuses pids).
_LOGS: dict[int, tuple[str, int]] = {}


def log(kind: str, mid: int, **kw) -> None:
    pid = os.getpid()
    if pid not in _LOGS:
        with open("/proc/self/stat") as f:
            start = f.read().rsplit(")", 1)[1].split()[19]
        proc = f"{STAGE}-{pid}-{start}"
        path = os.path.join(os.environ["CHAOS_LOG"], f"{proc}.jsonl")
        _LOGS[pid] = (proc, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    proc, fd = _LOGS[pid]
    rec = {
        "ev": kind,
        "id": mid,
        "stage": STAGE,
        "pid": pid,
        "proc": proc,
        "did": DID,
        "t": time.time(),
    }
    rec.update(kw)
    os.write(fd, (json.dumps(rec) + "\n").encode())


_Scope = getattr(transaction, "Scope", None)
_Batch = getattr(transaction, "GroupBatch", None)
#: Transitions that ran inside a group commit's transaction, not committed yet:
#: logged as applied only once the batch commits (a worker killed before its
#: COMMIT applied nothing), dropped if the batch rolls back.
PENDING: list[tuple[int, str]] = []


def _applied(mid: int, kind: str) -> None:
    log("tx", mid, fn=kind, ret=True)
    log("end", mid)


if _Scope is not None:
    _orig_write = _Scope.write

    def _write(self, statement, *args, **kw):
        mid, kind = statement.message_id, statement.kind
        group = self.mode is transaction.CommitMode.GROUP
        role = args[0] if args else kw.get("role")
        deferred = group and transaction.call_mode(self.mode, self.depth, role) is (
            transaction.CallMode.DEFERRED
        )
        try:
            _orig_write(self, statement, *args, **kw)
        except transaction.RowLost:
            log("tx", mid, fn=kind, ret=False)
            log("end", mid)
            raise
        except Exception as exc:
            log("tx", mid, fn=kind, ret=None, error=type(exc).__name__)
            raise
        if deferred:
            return  # sent with the batch: see _note_results
        if group:
            PENDING.append((mid, kind))  # in the batch's transaction: see _commit
            return
        _applied(mid, kind)

    _Scope.write = _write

if _Batch is not None:
    _orig_note, _orig_commit = _Batch.note_results, _Batch.commit
    _orig_rollback = _Batch.rollback

    def _note_results(self, items, changed):
        _orig_note(self, items, changed)
        for item, ok in zip(items, changed, strict=True):
            mid, kind = item.statement.message_id, item.statement.kind
            if ok:
                PENDING.append((mid, kind))
            else:
                log("tx", mid, fn=kind, ret=False)
                log("end", mid)

    def _commit(self):
        _orig_commit(self)
        for mid, kind in PENDING:
            _applied(mid, kind)
        PENDING.clear()

    def _rollback(self):
        PENDING.clear()
        _orig_rollback(self)

    _Batch.note_results = _note_results
    _Batch.commit = _commit
    _Batch.rollback = _rollback


def handle(msg):
    log("start", msg.id)
    time.sleep(random.uniform(0.02, 0.2))
    return Finish()


# The SDK's defaults (group commit under a dispatcher that offers the in-hand
# slot): the wrappers above log a transition as applied only once it committed.
run({STAGE: handle})
