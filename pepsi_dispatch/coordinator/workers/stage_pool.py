"""Per-stage worker pools: capacity, packing, spawn and cooldown.

A :class:`StagePool` holds the live workers of one stage and decides where
claimed ids go. Its invariants:

* never more than PARALLELISM workers *processing* (retiring ones count, so a
  reload never overshoots the cap). A worker that nears MAX_MESSAGES gets a
  *warm spare* (at most one per stage): its replacement is started early but
  handed nothing -- it holds no slot and processes nothing -- until the old
  worker has drained and given its slot up; then the spare takes the slot at
  once, already started;
* never more than QUEUE_LIMIT unanswered ids on one worker;
* work packed onto the fewest workers: ids go to the fullest worker that still
  has room, and a new worker is spawned only when all are full -- so surplus
  workers go idle and are stopped after WORKER_IDLE_TIMEOUT;
* MIN_WORKERS workers kept started (warm) while the stage is idle: they hold
  PARALLELISM slots like any worker, WORKER_IDLE_TIMEOUT never stops the stage
  below that count, and the stage is topped up to it (within PARALLELISM and
  outside a cooldown) when one goes; a PAUSED stage keeps none.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Mapping
from typing import Any

from pepsi_dispatch.backoff import Backoff
from pepsi_dispatch.config import StageConfig
from pepsi_dispatch.contract import INF
from pepsi_dispatch.coordinator.workers.children import Fork
from pepsi_dispatch.coordinator.workers.process import WorkerProcess
from pepsi_dispatch.coordinator.workers.templates import TemplateProcess

log = logging.getLogger(__name__)

#: Spawn cooldown: first hold-off, then doubling up to the cap (seconds).
COOLDOWN_FIRST = 1.0
COOLDOWN_MAX = 60.0
#: Assumed start-up time of a worker (spawn to first answer) until one is measured.
STARTUP_GUESS = 0.5


#: How long an offered template may take to greet before the stage starts one
#: by exec instead, once a worker said its program can be one (seconds).
OFFER_GRACE = 2.0
#: How long a stage's first burst holds its other workers back for the template
#: its first worker is about to fork (StagePool.template_on_its_way; seconds).
#: An SDK worker forks it after its imports (0.15-0.2 s here); a program that
#: takes no offers costs its other workers at most this wait, once per pool.
TEMPLATE_HOLD = 0.5
#: How long after an offer the supervisor looks for the greeting of a template
#: whose worker stopped (StagePool.greeting_awaited; seconds). A probe's worker
#: forks it after its imports, which a loaded box may stretch to seconds.
GREETING_WAIT = 30.0


class StagePool:
    """The workers of one stage and its spawn cooldown."""

    def __init__(self, config: StageConfig, generation: int) -> None:
        """A pool for the stage ``config`` describes (no workers yet)."""
        self.config = config
        self.name = config.name
        self.generation = generation
        self.workers: list[WorkerProcess] = []
        #: monotonic time until which no worker is spawned (0 = none).
        self.cooldown_until = 0.0
        #: delay of the next cooldown (1 s doubling to 60 s; reset by an answer).
        self.cooldown = Backoff(COOLDOWN_FIRST, COOLDOWN_MAX)
        #: monotonic time of the first cooldown since a worker last answered
        #: (None: not held off) and the latest cooldown's reason: the stage's
        #: health on the heartbeat (:meth:`health`).
        self.held_since: float | None = None
        self.held_cause: str | None = None
        #: warm spares: started, handed nothing, holding no slot (pids in ``workers``).
        self.spares: set[int] = set()
        #: workers that drained at MAX_MESSAGES and gave their slot up while exiting.
        self.recycled: set[int] = set()
        #: workers that already have a spare started for them.
        self.heirs: set[int] = set()
        #: spawn time per worker pid until its first answer; start-up estimate (s).
        self.spawned_at: dict[int, float] = {}
        self.startup = STARTUP_GUESS
        #: the stage's template process (templates.py), once its workers said
        #: they can have one; tried at most once per pool (a reload makes a new pool).
        self.template: TemplateProcess | None = None
        self.template_tried = False
        #: a worker of this stage said it takes claimed rows on its pipe: the
        #: claim returns this stage's rows as lines (Supervisor.line_limits)
        self.takes_rows = False
        #: when the template was last offered to an exec'd worker (monotonic), and
        #: that worker's pid (None: the offer is not out, or its worker did not start)
        self.offered_at = 0.0
        self.offered_to: int | None = None
        #: claims and spawns are held back for the template on its way
        #: (:meth:`template_on_its_way`); the supervisor wakes the claim once it is not
        self.holding_for_template = False
        #: the template probe was started (once per pool: :meth:`probe_wanted`), or
        #: is not wanted (a reload found the stage without a template)
        self.probed = False

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

    def room(self, w: WorkerProcess) -> int:
        """How many more ids ``w`` may take now."""
        if w.retiring or w.stopping or w.eof or w.stdin_fd is None or w.pid in self.spares:
            return 0
        return max(0, min(self.queue_limit - len(w.inflight), self.max_messages - w.sent))

    def holders(self) -> int:
        """Workers holding a PARALLELISM slot: all but warm spares and recycled ones.

        A recycled worker has drained (nothing in flight, stdin closed) and is
        only exiting; a spare has been handed nothing yet. Neither processes.
        """
        return len(self.workers) - len(self.spares) - len(self.recycled)

    @property
    def min_workers(self) -> int:
        """MIN_WORKERS: workers kept started while idle; none while the stage is PAUSED."""
        return 0 if self.config.paused else self.config.min_workers

    def _stays(self, w: WorkerProcess) -> bool:
        """Does ``w`` count toward MIN_WORKERS? Not when it is on its way out:
        stopping, killed, at EOF, retired by a reload, or replaced by a warm
        spare already started for it (the spare counts instead)."""
        return not (w.retiring or w.stopping or w.eof or w.pid in self.heirs)

    def warm(self) -> int:
        """Workers that count toward MIN_WORKERS (a warm spare among them)."""
        return sum(1 for w in self.workers if self._stays(w))

    def keeps_idle(self, w: WorkerProcess) -> bool:
        """Is the idle ``w`` kept past WORKER_IDLE_TIMEOUT? Yes if it counts toward
        MIN_WORKERS and the stage would otherwise fall below it."""
        return bool(self.min_workers) and self._stays(w) and self.warm() <= self.min_workers

    def warm_wanted(self) -> int:
        """Workers to start so that MIN_WORKERS are up: what is missing, within
        the PARALLELISM slots still free (a cooldown is not looked at here)."""
        if not self.min_workers:
            return 0
        missing = self.min_workers - self.warm()
        return max(0, min(missing, self.parallelism - self.holders()))

    def warm_due(self, now: float) -> float:
        """When a worker is next started to keep MIN_WORKERS: ``now``, the end of
        the spawn cooldown, or INF (none is missing, or no slot is free)."""
        return max(now, self.cooldown_until) if self.warm_wanted() else INF

    def inflight(self) -> int:
        """Unanswered ids on this stage's workers."""
        return sum(len(w.inflight) for w in self.workers)

    def capacity(self, now: float) -> int:
        """Ids this stage can place right now (what to claim).

        Room on live workers plus QUEUE_LIMIT per worker slot still free;
        during a spawn cooldown only slots a warm spare can take count. This is PARALLELISM ×
        QUEUE_LIMIT minus what is in flight, minus what retiring workers and
        MAX_MESSAGES make unusable -- so claimed ids always find a place.
        A PAUSED stage claims nothing (its workers finish what they hold); a
        stage waiting for its first worker's template counts no free slot
        (:meth:`template_on_its_way`).
        """
        if self.config.paused:
            return 0
        cap = sum(self.room(w) for w in self.workers)
        slots = max(0, self.parallelism - self.holders())
        if now < self.cooldown_until:
            slots = min(slots, len(self.spares))  # a started spare may still take a slot
        if slots and self.template_on_its_way(now):
            slots = 0
        return cap + slots * self.queue_limit

    # -- placement ---------------------------------------------------------------
    def place(
        self,
        ids: list[int],
        now: float,
        spawn: Callable[[StagePool], WorkerProcess | None],
    ) -> tuple[list[tuple[WorkerProcess, list[int]]], list[int]]:
        """Distribute ``ids`` (in order) over workers, spawning as needed.

        Returns the (worker, ids) assignments -- one batch per worker, to be
        written in one go -- and the ids that found no place (spawn failed or
        cooldown), which the caller releases at once.
        """
        out: list[tuple[WorkerProcess, list[int]]] = []
        i = 0
        used: set[int] = set()
        while i < len(ids):
            best: WorkerProcess | None = None
            best_room = 0
            for w in self.workers:
                if w.pid in used:
                    continue
                r = self.room(w)
                if r > 0 and (best is None or len(w.inflight) > len(best.inflight)):
                    best, best_room = w, r
            if best is None:
                if self.holders() >= self.parallelism:
                    break
                best = self._promote()
                if best is None and (now < self.cooldown_until or self.template_on_its_way(now)):
                    break
                if best is None:
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

    # -- recycling ---------------------------------------------------------------
    def _promote(self) -> WorkerProcess | None:
        """A warm spare takes a free slot (the oldest first); None if there is none."""
        for w in self.workers:
            if w.pid in self.spares and not (
                w.retiring or w.stopping or w.eof or w.stdin_fd is None
            ):
                self.spares.discard(w.pid)
                return w
        return None

    def answered(self, w: WorkerProcess, now: float) -> None:
        """Note ``w``'s first answer: the start-up time of this stage's workers.

        Only workers handed ids at once count (a spare's first answer also
        includes its wait); a moving average follows the load of the box.
        """
        t0 = self.spawned_at.pop(w.pid, None)
        if t0 is not None:
            self.startup = 0.7 * self.startup + 0.3 * (now - t0)

    def wants_spare(self, w: WorkerProcess, now: float) -> bool:
        """Should a replacement for ``w`` start now, so it is warm when ``w`` drains?

        Yes once ``w`` has been handed its last id, or earlier when, at its answer
        rate so far, its remaining messages take less than twice the measured
        start-up time of this stage's workers. At most one spare per stage: while
        one waits, the next worker to drain is replaced by it, and the others
        on demand. So a stage has at most PARALLELISM + 1 workers besides those
        that drained and are exiting.
        """
        if self.spares:
            return False  # one warm spare per stage at most
        if w.pid in self.heirs or w.pid in self.spares or w.retiring or w.stopping:
            return False
        if now < self.cooldown_until:
            return False
        if w.sent >= self.max_messages:
            return True
        if w.answers_received < self.queue_limit or not w.first_given:
            return False  # too early to tell its rate
        left = self.max_messages - w.answers_received
        rate = w.answers_received / max(1e-3, now - w.first_given)
        return left <= rate * 2 * self.startup + self.queue_limit

    def forget(self, w: WorkerProcess) -> None:
        """``w`` is gone (reaped): drop it from the recycling books."""
        self.spares.discard(w.pid)
        self.recycled.discard(w.pid)
        self.heirs.discard(w.pid)
        self.spawned_at.pop(w.pid, None)

    # -- template ----------------------------------------------------------------
    def probe_wanted(self, now: float) -> bool:
        """Should the stage's template be offered now, before any message, to a
        worker handed nothing and stopped at once (the template probe)? A
        program that can be a template (the SDK's, or one calling
        ``fork_point()``) forks it before it reads its stdin's EOF, so the
        stage's first burst forks its workers instead of starting interpreters;
        any other program just sees EOF and exits 0. Once per pool (the
        dispatcher's start; a reload, if the stage had a template), for a stage
        that is not PAUSED, keeps no MIN_WORKERS (its warm workers are offered
        the template), and has no worker, template or cooldown yet."""
        return not (
            self.probed
            or self.config.paused
            or self.min_workers
            or self.workers
            or self.template is not None
            or self.template_tried
            or now < self.cooldown_until
        )

    def template_offer(self, now: float) -> socket.socket | None:
        """The socket end to offer the worker about to be exec'd, so it can fork
        the stage's template from itself (templates.py); None while the stage
        has a template, is offering one, or has tried one."""
        if self.template is not None or self.template_tried:
            return None
        self.template, theirs = TemplateProcess.offer()
        self.offered_at = now
        return theirs

    def template_on_its_way(self, now: float) -> bool:
        """Is the stage's first worker about to fork the template? Then no other
        worker is exec'd meanwhile (:meth:`capacity` counts no free slot): they
        are forked once it greets. Exec'ing them side by side costs an
        interpreter start each, all inside the first burst, and on a small box
        they are not ready sooner than the first one alone. The wait ends when
        the template greets, when the offered worker answers or goes first (its
        program takes no offers), or after :data:`TEMPLATE_HOLD`. Only a stage
        whose one worker is the offered one waits: a program that takes no
        offer is offered again at each exec once its offered worker is gone,
        and its other workers must not wait at every recycle.
        """
        template, offeree = self.template, self.offered_to
        if template is None or offeree is None or not template.offered:
            return False
        if len(self.workers) != 1 or self.workers[0].pid != offeree:
            return False
        if now - self.offered_at >= TEMPLATE_HOLD or self._template_ready():
            return False
        first = self.workers[0]
        waiting = not (first.answers_received or first.eof)
        self.holding_for_template = waiting
        return waiting

    def greeting_awaited(self, now: float) -> bool:
        """Is an offer out whose worker is stopping or gone, its template's
        greeting not read yet? The template probe's worker is stopped at once,
        so nothing else would read the greeting before the stage's first burst;
        the supervisor looks for it (:meth:`read_greeting`) until it comes, the
        offer's socket closes (no template: dropped), or :data:`GREETING_WAIT`
        after the offer. An offer to a worker still serving is read when the
        stage next spawns a worker."""
        template = self.template
        if template is None or not template.offered or now - self.offered_at >= GREETING_WAIT:
            return False
        return not any(w.pid == self.offered_to and not w.stopping for w in self.workers)

    def read_greeting(self) -> None:
        """Read the template's greeting if it has arrived (never blocks; logged
        once read); an offer whose worker left without taking it is dropped."""
        self._template_ready()

    def start_template(self, argv: list[str], env: Mapping[str, str], now: float) -> None:
        """Start the stage's template (once per pool); new workers are forked by
        it once it is ready, exec'd until then. Nothing when a worker's template
        serves already; an offer still not taken is withdrawn first (a program
        that can be a template but does not take offers)."""
        if self._template_ready():
            return
        if self.template is not None:
            if now - self.offered_at < OFFER_GRACE:
                return  # the worker forks it before it connects: its greeting is on the way
            self.template.close()
            self.template = None
        self.template_tried = True
        try:
            self.template = TemplateProcess(argv, env)
        except OSError as exc:
            log.warning("stage %s: cannot start a template process: %s", self.name, exc)
            return
        log.info("stage %s: template process pid %d started", self.name, self.template.pid)

    def template_fork(self) -> Fork | None:
        """How to fork a worker through the template, if it is ready."""
        if self._template_ready():
            assert self.template is not None
            return self.template.fork
        return None

    def _template_ready(self) -> bool:
        """Is the template ready to fork (never blocks)? An offer a worker took
        becomes the stage's template (logged); one not taken whose worker is
        gone is dropped quietly, a template that failed is ended."""
        template = self.template
        if template is None:
            return False
        offered = template.offered
        if template.ready():
            if offered:
                self.template_tried = True
                log.info(
                    "stage %s: template process pid %d forked by the stage's first worker",
                    self.name,
                    template.pid,
                )
            return True
        if template.sock.fileno() < 0:
            if offered:  # not taken (not an SDK program), or its worker is gone
                self.template = None
            else:
                self.template_failed("it did not say ready")
        return False

    def template_failed(self, why: object) -> None:
        """The template could not fork a worker: end it, exec workers from now on."""
        if self.template is not None:
            log.warning(
                "stage %s: template process pid %d failed (%s); starting workers by exec",
                self.name,
                self.template.pid,
                why,
            )
        self.close_template()

    def close_template(self) -> None:
        """End the template, if any (a reload, the dispatcher stopping)."""
        template, self.template = self.template, None
        if template is not None:
            template.close()

    # -- cooldown ----------------------------------------------------------------
    def start_cooldown(self, now: float, why: str) -> None:
        """Hold the stage off spawning for a growing delay (1 s doubling to 60 s).

        While a cooldown runs, further reasons (the other workers of the same
        failed batch) neither extend nor log it: one line per cooldown.
        """
        if now < self.cooldown_until:
            log.debug("stage %s: %s (already cooling down)", self.name, why)
            return
        if self.held_since is None:
            self.held_since = now
        self.held_cause = why
        delay = self.cooldown.next()
        self.cooldown_until = now + delay
        log.warning("stage %s: %s; holding off new workers for %.0f s", self.name, why, delay)

    def success(self) -> None:
        """A worker answered: the stage works, forget the cooldown history."""
        self.cooldown.reset()
        self.held_since = None
        self.held_cause = None

    def end_hold_off(self, why: str) -> bool:
        """End the stage's hold-off now (``why``: a resume's "try now", a reload):
        no cooldown, the backoff back to its first delay, the health ``serving``
        again. A program still broken is held off anew at its next failure, for
        1 s first. True when the stage was held off (then logged)."""
        held = self.held_since is not None or self.cooldown_until > 0.0
        self.cooldown_until = 0.0
        self.cooldown.reset()
        self.held_since = None
        self.held_cause = None
        if held:
            log.info("stage %s: hold-off ended (%s), starting workers again", self.name, why)
        return held

    def take_history(self, old: StagePool) -> None:
        """After a reload: the cooldown and hold-off of the stage's previous pool
        (called before its template is ended), and whether to probe: only when
        it had a template, for a program that is not one would start and exit
        for nothing at every reload."""
        self.cooldown_until = old.cooldown_until
        self.cooldown = old.cooldown
        self.held_since = old.held_since
        self.held_cause = old.held_cause
        self.probed = not old.has_or_awaits_template()

    def has_or_awaits_template(self) -> bool:
        """Does the stage have a template, or an offer still open (its worker
        may be forking it)? Reads a greeting that has arrived (never blocks):
        the template a probe forked says ``ready`` on its own, unasked, and
        an offer whose worker is gone without taking it is dropped here."""
        self.read_greeting()
        return self.template is not None

    def health(self, now: float) -> dict[str, Any]:
        """The stage's health for the heartbeat (``pepsi.stage_health`` reads it).

        ``paused`` (PAUSED), ``no_worker`` (held off and no worker of the stage
        runs: nothing serves its rows), ``held_off`` (new workers held off since
        a cooldown began; the running ones serve on) or ``serving``. Held off
        lasts from the first cooldown until a worker answers, with the latest
        cooldown's cause and the seconds since it began.
        """
        if self.config.paused:
            return {"state": "paused"}
        if self.held_since is None:
            return {"state": "serving"}
        alive = [w for w in self.workers if not (w.stopping or w.eof)]
        return {
            "state": "held_off" if alive else "no_worker",
            "cause": self.held_cause,
            "held_seconds": round(max(0.0, now - self.held_since), 3),
        }


#: libpq variables that may carry the dispatcher's password: never passed to a
#: worker that has a WORKER_DSN of its own.
PASSWORD_ENV = ("PGPASSWORD", "PGPASSFILE", "PGSERVICE", "PGSERVICEFILE")


def worker_env(
    base: Mapping[str, str],
    stage: str,
    dsn: str,
    dispatcher_id: int,
    config_path: object = None,
    worker_dsn: str | None = None,
) -> dict[str, str]:
    """Environment of a worker: ours plus PEPSI_STAGE, PEPSI_DSN, PEPSI_DISPATCHER_ID.

    ``PEPSI_CONFIG`` names the file the dispatcher loaded (``config_path``) unless
    it is set already, so the worker's default search finds the same file. With a
    ``worker_dsn`` (WORKER_DSN) that is its PEPSI_DSN and the libpq password
    variables are dropped: the dispatcher's credentials never reach a worker.
    """
    env = dict(base)
    if worker_dsn:
        dsn = worker_dsn
        for name in PASSWORD_ENV:
            env.pop(name, None)
    if config_path is not None and not env.get("PEPSI_CONFIG"):
        env["PEPSI_CONFIG"] = str(config_path)
    env["PEPSI_STAGE"] = stage
    env["PEPSI_DSN"] = dsn
    env["PEPSI_DISPATCHER_ID"] = str(dispatcher_id)
    return env


__all__ = ["StagePool", "WorkerProcess", "worker_env"]
