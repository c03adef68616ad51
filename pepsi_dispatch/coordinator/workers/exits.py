"""How a dead worker's unanswered ids are settled (invariant 5, docs/INTERNALS.md).

:func:`process.classify_exit` decides what the end was; :func:`settle_exit`
records its outcome in the ledger and statistics and says it in the log:

- crash: the message in hand fails (the one the worker's in-hand slot names,
  else the head of line), the rest are released;
- killed at MAX_RUNTIME: the same blame (:func:`blame`), as ``timeout``: the
  message in hand times out (else the overdue head of line), the rest are
  released -- those whose answers it wrote before it died were answered;
- died before reading: nothing fails, the stage cools down;
- killed (protocol error, watchdog): all are released;
- exit 75 (EX_TEMPFAIL): all are released, the stage cools down;
- exit 78 (no stage in its configuration): all are released, ERROR, cool down;
- ids never delivered (EPIPE) were released by the ledger when reaped.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass

from pepsi_dispatch.contract import EX_TEMPFAIL
from pepsi_dispatch.coordinator.failwatch import FailureWatch
from pepsi_dispatch.coordinator.ledger import Ledger
from pepsi_dispatch.coordinator.stats import Stats
from pepsi_dispatch.coordinator.workers.process import ExitKind, WorkerProcess, describe_exit
from pepsi_dispatch.coordinator.workers.stage_pool import StagePool

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ExitBooks:
    """Where a worker's end is written down: the in-flight ledger (who failed,
    who is released), the failure watch and the statistics."""

    ledger: Ledger
    failwatch: FailureWatch
    stats: Stats


def settle_exit(
    books: ExitBooks,
    w: WorkerProcess,
    pool: StagePool | None,
    kind: ExitKind,
    rc: int,
    ids: list[int],
    n_undelivered: int,
    now: float,
    shutting_down: bool,
    config_path: str,
) -> None:
    """Settle the unanswered ``ids`` of the dead worker ``w`` as ``kind`` says.
    ``config_path`` is the dispatcher's configuration file, named in the fix
    for a worker that does not know its stage."""
    if kind is ExitKind.CRASH or kind is ExitKind.TIMEOUT:
        blame(books, w, rc, ids, now)
    else:
        books.ledger.release(ids)
    cooled = log_exit(w, pool, kind, rc, len(ids), n_undelivered, now, shutting_down, config_path)
    expected = w.stopping or shutting_down
    if (
        pool is not None
        and not cooled
        and not expected
        and not w.killed
        and w.answers_received == 0
        and not shutting_down
    ):
        pool.start_cooldown(
            now,
            f"worker pid {w.pid} {describe_exit(rc).removeprefix('worker ')}"
            f" before answering anything{_last_words(w)}",
        )


def blame(books: ExitBooks, w: WorkerProcess, rc: int, ids: list[int], now: float) -> None:
    """A crash (exit status ``rc``) or a MAX_RUNTIME kill (``w.overdue`` set): the
    message in hand fails, or times out (the one ``w``'s in-hand slot names,
    else the head of line: for a timeout, the head that was overdue); the rest
    never ran, or were rolled back with it, and are released. A timed-out
    worker whose overdue head was answered after all (its answer was in the
    pipe) has nothing to blame."""
    overdue = w.overdue
    head = ids[0] if overdue is None else overdue.head
    if head not in ids:
        log.info(
            "stage %s worker pid %d killed at MAX_RUNTIME, but message %d was answered"
            " meanwhile; %d message(s) released",
            w.stage,
            w.pid,
            head,
            len(ids),
        )
        books.ledger.release(ids)
        return
    in_hand = w.slot.in_hand()
    blamed = in_hand if in_hand in ids else head
    why = "its handler was running" if blamed == in_hand else "head of line"
    if overdue is None:
        reason = describe_exit(rc)
        books.ledger.crashed(ids, reason, blamed)
        books.failwatch.failed(w.stage, reason)
        books.stats.crashed(w.stage, now - w.head_since)
        what = f"crashed: {reason}; message {blamed} failed"
    else:
        books.ledger.crashed(ids, overdue.reason, blamed, "timeout")
        books.stats.timed_out(w.stage, overdue.seconds)
        what = f"killed at MAX_RUNTIME; message {blamed} timed out"
    log.warning(
        "stage %s worker pid %d %s (%s), %d released", w.stage, w.pid, what, why, len(ids) - 1
    )


def _last_words(w: WorkerProcess) -> str:
    """What the worker's stderr says of why it died, for a cooldown's cause: its
    first error-like line and its last lines (see lastwords.py)."""
    cause = w.last_words.cause()
    return f"; its stderr: {cause}" if cause else ""


def log_exit(
    w: WorkerProcess,
    pool: StagePool | None,
    kind: ExitKind,
    rc: int,
    n: int,
    n_undelivered: int,
    now: float,
    shutting_down: bool,
    config_path: str,
) -> bool:
    """Say how ``w`` ended (cooling its stage down where that is the answer);
    True if it started a cooldown."""
    exit_text = describe_exit(rc).removeprefix("worker ")
    if kind is ExitKind.NO_STAGE:
        return _no_stage(w, pool, rc, n + n_undelivered, now, config_path)
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
        # One that failed before answering (a template probe, a spare): why, if it said.
        words = "" if normal or w.answers_received else _last_words(w)
        log.log(
            logging.INFO if normal else logging.WARNING,
            "stage %s worker pid %d stopped (%s): %s%s%s",
            w.stage,
            w.pid,
            w.stop_reason or "dispatcher stopping",
            exit_text,
            f"; {n} message(s) released" if n else "",
            words,
        )
    elif kind is ExitKind.EXITED:
        log.warning("stage %s worker pid %d exited unexpectedly: %s", w.stage, w.pid, exit_text)
    return False


def _no_stage(
    w: WorkerProcess, pool: StagePool | None, rc: int, n: int, now: float, config_path: str
) -> bool:
    """The worker did not find its stage in its configuration and touched
    nothing (worker SDK): no failure, the stage waits for a fixed config."""
    if pool is None:
        return False
    if now >= pool.cooldown_until:
        log.error(
            "stage %s: worker pid %d found no stage %s in its configuration"
            " (exit %d); fix PROGRAM or give it this dispatcher's file (%s:"
            " PEPSI_CONFIG, or CONFIG_FILE in [pepsi-dispatch]); %d message(s)"
            " stay pending",
            w.stage,
            w.pid,
            w.stage,
            rc,
            config_path,
            n,
        )
    pool.start_cooldown(now, f"worker pid {w.pid} does not know stage {w.stage}")
    return True


def _cool_down(
    w: WorkerProcess,
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
            f" ({n + n_undelivered} message(s) stay pending){_last_words(w)}",
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


__all__ = ["ExitBooks", "blame", "log_exit", "settle_exit"]
