#!/usr/bin/env python3
"""The endurance pipeline's stages (the Python SDK): ``a`` -> ``b`` -> ``c``.

``payload.kind`` picks what happens at ``a``: ``ok`` advances, ``fail`` fails,
``pause`` pauses once (a stage's own retry), ``crash`` raises once (an
automatic retry, RETRY_DELAY is set for ``a``). ``b`` advances, ``c`` finishes.
At its first run of a message, ``a`` appends ``id enqueue->start seconds`` to
``$ENDURANCE_LOG/lat-PID.txt``; ``c`` appends the id it finished to
``$ENDURANCE_LOG/done-PID.txt`` (``done`` rows are purged by RETENTION, so this
is how the driver accounts for them).
"""

from __future__ import annotations

import os
import time

from pepsi_dispatch.worker import Advance, Fail, Finish, Pause, run

LOG_DIR = os.environ["ENDURANCE_LOG"]


def _append(name: str, line: str) -> None:
    with open(os.path.join(LOG_DIR, f"{name}-{os.getpid()}.txt"), "a") as f:
        f.write(line + "\n")


def stage_a(msg):
    kind = msg.payload.get("kind", "ok")
    if msg.retries == 0 and "t" in msg.payload:
        _append("lat", f"{msg.id} {time.time() - msg.payload['t']:.4f}")
    if kind == "fail":
        return Fail("endurance: scripted failure")
    if kind == "pause" and msg.retries == 0:
        return Pause(1.0, "endurance: busy, once")
    if kind == "crash" and msg.retries == 0:
        raise RuntimeError("endurance: scripted exception, retried automatically")
    return Advance("b")


def stage_b(msg):
    return Advance("c")


def stage_c(msg):
    _append("done", str(msg.id))
    return Finish()


run({"a": stage_a, "b": stage_b, "c": stage_c})
