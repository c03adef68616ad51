"""Per-stage worker pools: capacity, packing, spawn and cooldown.

A :class:`StagePool` holds the live workers of one stage and decides where
claimed ids go. Its invariants (SPEC §6):

* never more than PARALLELISM workers (retiring ones count, so a reload or a
  MAX_MESSAGES recycle never overshoots the cap);
* never more than QUEUE_LIMIT unanswered ids on one worker;
* work packed onto the fewest workers: ids go to the fullest worker that still
  has room, and a new worker is spawned only when all are full -- so surplus
  workers go idle and are stopped after WORKER_IDLE_TIMEOUT.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from .backoff import Backoff
from .config import StageConfig
from .process import Worker

log = logging.getLogger(__name__)

#: Spawn cooldown: first hold-off, then doubling up to the cap (seconds).
COOLDOWN_FIRST = 1.0
COOLDOWN_MAX = 60.0


class StagePool:
    """The workers of one stage and its spawn cooldown."""

    def __init__(self, config: StageConfig, generation: int) -> None:
        """A pool for the stage ``config`` describes (no workers yet)."""
        self.config = config
        self.name = config.name
        self.generation = generation
        self.workers: list[Worker] = []
        #: monotonic time until which no worker is spawned (0 = none).
        self.cooldown_until = 0.0
        #: delay of the next cooldown (1 s doubling to 60 s; reset by an answer).
        self.cooldown = Backoff(COOLDOWN_FIRST, COOLDOWN_MAX)

    # -- numbers --------------------------------------------------------------
    @property
    def parallelism(self) -> int:
        """PARALLELISM: most workers at once (retiring ones included)."""
        return self.config.parallelism

    @property
    def queue_limit(self) -> int:
        """QUEUE_LIMIT: most unanswered ids on one worker."""
        return self.config.queue_limit

    @property
    def max_messages(self) -> int:
        """MAX_MESSAGES: ids one worker gets before it is recycled."""
        return self.config.max_messages

    def room(self, w: Worker) -> int:
        """How many more ids ``w`` may take now."""
        if w.retiring or w.stopping or w.eof or w.stdin_fd is None:
            return 0
        return max(0, min(self.queue_limit - len(w.inflight), self.max_messages - w.sent))

    def inflight(self) -> int:
        """Unanswered ids on this stage's workers."""
        return sum(len(w.inflight) for w in self.workers)

    def capacity(self, now: float) -> int:
        """Ids this stage can place right now (what to claim).

        Room on live workers plus QUEUE_LIMIT per worker slot still free;
        slots count only outside a spawn cooldown. This is PARALLELISM ×
        QUEUE_LIMIT minus what is in flight, minus what retiring workers and
        MAX_MESSAGES make unusable -- so claimed ids always find a place.
        A PAUSED stage claims nothing (its workers finish what they hold).
        """
        if self.config.paused:
            return 0
        cap = sum(self.room(w) for w in self.workers)
        if now >= self.cooldown_until:
            cap += max(0, self.parallelism - len(self.workers)) * self.queue_limit
        return cap

    # -- placement ---------------------------------------------------------------
    def place(
        self,
        ids: list[int],
        now: float,
        spawn: Callable[[StagePool], Worker | None],
    ) -> tuple[list[tuple[Worker, list[int]]], list[int]]:
        """Distribute ``ids`` (in order) over workers, spawning as needed.

        Returns the (worker, ids) assignments -- one batch per worker, to be
        written in one go -- and the ids that found no place (spawn failed or
        cooldown), which the caller releases at once.
        """
        out: list[tuple[Worker, list[int]]] = []
        i = 0
        used: set[int] = set()
        while i < len(ids):
            best: Worker | None = None
            best_room = 0
            for w in self.workers:
                if w.pid in used:
                    continue
                r = self.room(w)
                if r > 0 and (best is None or len(w.inflight) > len(best.inflight)):
                    best, best_room = w, r
            if best is None:
                if len(self.workers) >= self.parallelism or now < self.cooldown_until:
                    break
                best = spawn(self)
                if best is None:
                    break
                best_room = self.room(best)
                if best_room <= 0:
                    break
            used.add(best.pid)
            batch = ids[i : i + best_room]
            i += len(batch)
            out.append((best, batch))
        return out, ids[i:]

    # -- cooldown ----------------------------------------------------------------
    def start_cooldown(self, now: float, why: str) -> None:
        """Hold the stage off spawning for a growing delay (1 s doubling to 60 s).

        While a cooldown runs, further reasons (the other workers of the same
        failed batch) neither extend nor log it: one line per cooldown.
        """
        if now < self.cooldown_until:
            log.debug("stage %s: %s (already cooling down)", self.name, why)
            return
        delay = self.cooldown.next()
        self.cooldown_until = now + delay
        log.warning("stage %s: %s; holding off new workers for %.0f s", self.name, why, delay)

    def success(self) -> None:
        """A worker answered: the stage works, forget the cooldown history."""
        self.cooldown.reset()


def worker_env(base: Mapping[str, str], stage: str, dsn: str, dispatcher_id: int) -> dict[str, str]:
    """Environment of a worker: ours plus PEPSI_STAGE, PEPSI_DSN, PEPSI_DISPATCHER_ID."""
    env = dict(base)
    env["PEPSI_STAGE"] = stage
    env["PEPSI_DSN"] = dsn
    env["PEPSI_DISPATCHER_ID"] = str(dispatcher_id)
    return env


__all__ = ["StagePool", "Worker", "worker_env"]
