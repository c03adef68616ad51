"""Answer intake: a worker's answer lines into the ledger and the statistics.

The supervisor reads a worker's stdout and hands the complete lines here, in
order. Each answer settles the worker's head-of-line id: a bare ``0`` (the hot
path, batched), ``0 fused=b,c`` (checked against the graph), ``N reason`` (the
message failed), or anything else (a protocol error: the message fails and the
worker is stopped). After a batch the stage may want a warm spare, and a
drained worker may be retired or recycled at MAX_MESSAGES.
"""

from __future__ import annotations

import logging
from typing import Protocol

from pepsi_dispatch.config import Config
from pepsi_dispatch.coordinator.failwatch import FailureWatch
from pepsi_dispatch.coordinator.ledger import Ledger
from pepsi_dispatch.coordinator.stats import Stats
from pepsi_dispatch.coordinator.workers.answers import Answer, AnswerKind, parse_answer
from pepsi_dispatch.coordinator.workers.process import WorkerProcess
from pepsi_dispatch.coordinator.workers.stage_pool import StagePool

log = logging.getLogger(__name__)


class IntakeOwner(Protocol):
    """What answer intake needs of the workers' owner (the supervisor)."""

    config: Config

    def pool_of(self, w: WorkerProcess) -> StagePool | None: ...

    def kill(self, w: WorkerProcess) -> None: ...

    def stop(self, w: WorkerProcess, now: float, why: str) -> None: ...

    def spawn_spare(self, pool: StagePool, old: WorkerProcess, now: float) -> None: ...

    def start_template(self, pool: StagePool, w: WorkerProcess, now: float) -> None: ...

    def on_answers(self) -> None: ...


class AnswerIntake:
    """Settles answered ids (see the module's text)."""

    def __init__(
        self, ledger: Ledger, stats: Stats, failwatch: FailureWatch, owner: IntakeOwner
    ) -> None:
        self.ledger = ledger
        self.stats = stats
        self.failwatch = failwatch
        self.owner = owner

    def take(self, w: WorkerProcess, lines: list[bytes], now: float) -> None:
        """Process answer lines of ``w`` in order (docs/WORKERS.md, the protocol)."""
        if w.killed and w.overdue is None:
            return  # its in-flight list is being torn down; answers no longer map to ids
        # (Killed at MAX_RUNTIME, its in-flight list is intact until it is reaped:
        # what it answered before it died was committed, and is answered.)
        w.reading = True
        pool = self.owner.pool_of(w)
        debug = log.isEnabledFor(logging.DEBUG)
        inflight = w.inflight
        if not debug and len(lines) <= len(inflight) and lines.count(b"0") == len(lines):
            self._all_ok(w, len(lines), now)  # the hot path, batched
            lines = []
        for line in lines:
            if not inflight:
                log.warning(
                    "stage %s worker pid %d: answer %r with no message in flight "
                    "(protocol error); stopping it",
                    w.stage,
                    w.pid,
                    line[:200],
                )
                self.owner.kill(w)
                break
            message_id = inflight.popleft()
            # (Still in ``inflight``: the stage let go of the row -- advanced it to
            # itself, or paused it and it was requeued -- and it was claimed and
            # handed to this same worker again. That second copy is still ours.)
            self.ledger.let_go(message_id, w, message_id in inflight)
            seconds = now - w.head_since
            w.head_since = now
            w.answers_received += 1
            if line == b"0":  # the hot path
                self.ledger.answered(message_id, w.stage)
                self.failwatch.succeeded.add(w.stage)
                self.stats.succeeded(w.stage, seconds)
                if debug:
                    log.debug(
                        "stage %s pid %d: %d done (%.3f s)", w.stage, w.pid, message_id, seconds
                    )
                continue
            if not self._answer(w, pool, message_id, line, seconds, now):
                break
        self._answered(w, pool, now)

    def _all_ok(self, w: WorkerProcess, n: int, now: float) -> None:
        """The next ``n`` answers of ``w`` are all a bare ``0``: what the loop in
        :meth:`take` does for each, once per batch (2-3x less CPU per
        answer; docs/BENCHMARKS.md). The first answer's service time counts
        from the head's hand-out, the others' from it (0 s), as one by one."""
        inflight = w.inflight
        ids = [inflight.popleft() for _ in range(n)]
        # An id still in ``inflight`` (or later in this batch) is a second copy,
        # still ours: walk backwards, so ``later`` is what follows each id.
        later = set(inflight)
        let_go, answered, stage = self.ledger.let_go, self.ledger.answered, w.stage
        for message_id in reversed(ids):
            let_go(message_id, w, message_id in later)
            later.add(message_id)
        for message_id in ids:
            answered(message_id, stage)
        seconds = now - w.head_since
        w.head_since = now
        w.answers_received += n
        self.failwatch.succeeded.add(stage)
        self.stats.succeeded_many(stage, seconds, n)

    def _answered(self, w: WorkerProcess, pool: StagePool | None, now: float) -> None:
        """After a batch of answers: the stage works, a warm spare may be due,
        room may have freed, and a drained worker may go."""
        if pool is not None and not w.killed:
            pool.success()
            pool.answered(w, now)
            if not pool.template_tried and w.slot.can_template:
                self.owner.start_template(pool, w, now)
            if pool.wants_spare(w, now):
                self.owner.spawn_spare(pool, w, now)
        self.owner.on_answers()
        self.ledger.want_claim()
        if not w.inflight and not w.killed:
            w.idle_since = now
            if not w.stopping:
                if w.retiring:
                    self.owner.stop(w, now, "retired by a reload")
                elif pool is not None and w.sent >= pool.max_messages:
                    # Recycled once drained: it gives its slot up now, to its warm
                    # spare if one was started (else a replacement spawns on demand).
                    self.owner.stop(w, now, f"MAX_MESSAGES ({pool.max_messages}) reached")
                    pool.recycled.add(w.pid)

    def _answer(
        self,
        w: WorkerProcess,
        pool: StagePool | None,
        message_id: int,
        line: bytes,
        seconds: float,
        now: float,
    ) -> bool:
        """One answer other than a bare ``0``; False if it ended the worker."""
        try:
            answer = parse_answer(line)
        except Exception as exc:  # noqa: BLE001 - a bug here must cost one worker only
            log.exception("stage %s worker pid %d: cannot classify an answer", w.stage, w.pid)
            answer = Answer(AnswerKind.PROTOCOL_ERROR, f"unreadable answer ({type(exc).__name__})")
        debug = log.isEnabledFor(logging.DEBUG)
        if answer.kind is AnswerKind.OK:
            fused = self._fused_allowed(w, answer.fused)
            self.ledger.answered(message_id, fused[-1] if fused else w.stage)
            self.failwatch.ok(w.stage)
            self.stats.succeeded(w.stage, seconds, fused)
            if debug:
                log.debug("stage %s pid %d: %d %s", w.stage, w.pid, message_id, answer.text)
            return True
        if answer.kind is AnswerKind.FAILED:
            self.ledger.failed(message_id, "failed", answer.text)
            self.failwatch.failed(w.stage, answer.text)
            self.stats.failed(w.stage, seconds)
            if debug:
                log.debug("stage %s pid %d: %d failed: %s", w.stage, w.pid, message_id, answer.text)
            return True
        self.ledger.failed(message_id, "failed", f'protocol error: worker answered "{answer.text}"')
        self.stats.failed(w.stage, seconds)
        log.warning(
            "stage %s worker pid %d: protocol error on message %d: %r; stopping it",
            w.stage,
            w.pid,
            message_id,
            answer.text[:200],
        )
        self.owner.kill(w)
        if pool is not None and w.answers_received == 1:
            # Garbage as its very first answer (a banner on stdout, a wrong
            # PROGRAM): without a pause each replacement would fail the
            # next message at once.
            pool.start_cooldown(now, f"worker pid {w.pid}'s first answer was garbage")
        return False

    def _fused_allowed(self, w: WorkerProcess, fused: tuple[str, ...]) -> tuple[str, ...]:
        """The stages of ``0 fused=...`` if the graph allows them, else none.

        Each name must be a configured stage that NEXT of the one before it
        (the worker's own stage first) names; otherwise the worker's claim is
        not counted in any stage's statistics (a typo must not create stats
        rows for stages that do not exist).
        """
        if not fused:
            return fused
        stages = self.owner.config.stages
        prev = w.stage
        for name in fused:
            here = stages.get(prev)
            if here is None or name not in here.next or name not in stages:
                log.warning(
                    "stage %s worker pid %d answered 'fused=%s', but %s is not a successor"
                    " of %s (NEXT); fused stages not counted",
                    w.stage,
                    w.pid,
                    ",".join(fused)[:200],
                    name[:64],
                    prev,
                )
                return ()
            prev = name
        return fused


__all__ = ["AnswerIntake", "IntakeOwner"]
