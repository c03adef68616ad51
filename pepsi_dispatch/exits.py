"""How a dead worker's unanswered ids are settled (issue 7, invariant 5).

:func:`process.classify_exit` decides what the end was; :func:`settle_exit`
records its outcome in the ledger and statistics and says it in the log:

- crash: the head-of-line message fails, the rest are released;
- died before reading: nothing fails, the stage cools down;
- killed (MAX_RUNTIME, protocol error, watchdog): all are released (a
  timeout's head was already failed as ``timeout`` by the watchdog);
- exit 75 (EX_TEMPFAIL): all are released, the stage cools down;
- ids never delivered (EPIPE) were released by the ledger when reaped.
"""

from __future__ import annotations

import logging
import signal

from .ledger import Ledger
from .pool import StagePool
from .process import EX_TEMPFAIL, ExitKind, Worker, describe_exit
from .stats import Stats

log = logging.getLogger(__name__)


def settle_exit(
    ledger: Ledger,
    stats: Stats,
    w: Worker,
    pool: StagePool | None,
    kind: ExitKind,
    rc: int,
    ids: list[int],
    n_undelivered: int,
    now: float,
    shutting_down: bool,
) -> None:
    """Settle the unanswered ``ids`` of the dead worker ``w`` as ``kind`` says."""
    if kind is ExitKind.CRASH:
        # A crash: the head-of-line message fails, the rest never ran.
        reason = describe_exit(rc)
        ledger.crashed(ids, reason)
        stats.crashed(w.stage, now - w.head_since)
        log.warning(
            "stage %s worker pid %d crashed: %s; message %d failed, %d released",
            w.stage,
            w.pid,
            reason,
            ids[0],
            len(ids) - 1,
        )
    else:
        ledger.release(ids)
    cooled = log_exit(w, pool, kind, rc, len(ids), n_undelivered, now, shutting_down)
    expected = w.stopping or shutting_down
    if (
        pool is not None
        and not cooled
        and not expected
        and not w.killed
        and w.answered == 0
        and not shutting_down
    ):
        pool.start_cooldown(now, f"worker pid {w.pid} died before answering anything")


def log_exit(
    w: Worker,
    pool: StagePool | None,
    kind: ExitKind,
    rc: int,
    n: int,
    n_undelivered: int,
    now: float,
    shutting_down: bool,
) -> bool:
    """Say how ``w`` ended (cooling its stage down where that is the answer);
    True if it started a cooldown."""
    exit_text = describe_exit(rc).removeprefix("worker ")
    if kind is ExitKind.DIED_BEFORE_READING or kind is ExitKind.TEMPFAIL:
        return _cool_down(w, pool, kind, exit_text, n, n_undelivered, now)
    if kind is ExitKind.DB_DOWN:
        log.warning(
            "stage %s worker pid %d %s while the database is unreachable;"
            " %d message(s) released, none failed",
            w.stage,
            w.pid,
            exit_text,
            n,
        )
    elif kind is ExitKind.KILLED:
        log.info("stage %s worker pid %d killed; %d message(s) released", w.stage, w.pid, n)
    elif kind is ExitKind.STOPPED:
        # Dying of the SIGTERM we sent is a normal way to stop.
        normal = rc == 0 or (shutting_down and rc == -signal.SIGTERM)
        log.log(
            logging.INFO if normal else logging.WARNING,
            "stage %s worker pid %d stopped (%s): %s%s",
            w.stage,
            w.pid,
            w.stop_reason or "dispatcher stopping",
            exit_text,
            f"; {n} message(s) released" if n else "",
        )
    elif kind is ExitKind.EXITED:
        log.warning("stage %s worker pid %d exited unexpectedly: %s", w.stage, w.pid, exit_text)
    return False


def _cool_down(
    w: Worker,
    pool: StagePool | None,
    kind: ExitKind,
    exit_text: str,
    n: int,
    n_undelivered: int,
    now: float,
) -> bool:
    """A worker that died before reading, or exited 75: nothing it held is
    done, nothing fails; its stage cools down. True if a cooldown started."""
    if kind is ExitKind.DIED_BEFORE_READING:
        # Its head-of-line message never started, so nothing fails --
        # otherwise a broken PROGRAM (bad arguments, a missing library) would
        # slowly fail the whole backlog, one message per cooldown.
        if pool is None:
            return False
        pool.start_cooldown(
            now,
            f"worker pid {w.pid} {exit_text} before reading its input"
            f" ({n + n_undelivered} message(s) stay pending)",
        )
        return True
    # "I could not reach the database; nothing I held is done."
    if pool is not None:
        pool.start_cooldown(
            now,
            f"worker pid {w.pid} could not reach the database (exit {EX_TEMPFAIL});"
            f" {n} message(s) released",
        )
        return True
    log.warning(
        "stage %s worker pid %d could not reach the database (exit %d); %d message(s) released",
        w.stage,
        w.pid,
        EX_TEMPFAIL,
        n,
    )
    return False


__all__ = ["log_exit", "settle_exit"]
