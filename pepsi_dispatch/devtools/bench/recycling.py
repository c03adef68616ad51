"""``bench --costs`` on the throughput run: what a recycled SDK worker costs.

Each SDK row's drain (MAX_MESSAGES as given) is paired with the same drain at
a MAX_MESSAGES no worker reaches (the *base*), in the same round, the order
alternating from round to round. Per pair:

* **recycles**: workers the dispatcher stopped at MAX_MESSAGES, counted in its
  log (run at INFO for these drains: ``stopped (MAX_MESSAGES (N) reached)``);
* **backends started by recycling**: the stage program's successful
  ``psycopg.connect`` calls up to the drain's end (probe worker, workers,
  templates: each one is a new PostgreSQL backend), minus the base's (its probe
  and its first burst, the same in both drains). The bench's SDK program notes
  each in an events file (:data:`EVENTS_ENV`; one appended line per connect and
  per fork). The server's own count, ``pg_stat_database.sessions``, read once
  the dispatcher has stopped and its backends have ended, is printed beside it
  as a check (it also counts the dispatcher's sessions and whatever the
  shutdown opened);
* **pass-on rate**: 1 - backends started by recycling / recycles: the share of
  recycles that started no backend. A replacement that connected itself is one
  backend; so is a session the template opened for a worker that had none to
  give back (it is lent next, but it is a new backend all the same);
* **pass-on after the first generation**: the same without the first
  generation's recycles, 1 - (backends - F) / (recycles - F), F being the
  base's workers (forked, or exec'd before the template was ready): a cold
  stage's first workers connect themselves (a burst connects in parallel;
  nothing is lent yet), so each of their recycles starts a backend whatever
  the lending does (the session opened for the next worker), once per
  template;
* **pass-on once two generations ended**: after the end of the 2F-th worker
  of the drain, 1 - connects / workers ended (no base: every connect then is
  a session a recycle did not get). The first generations' misses and the
  sessions opened to make up for them are behind; what a long-running
  dispatcher converges to;
* **forks lent a session**: of the template's forks, those that took a waiting
  session (the template's view; it counts the template's own connects as lent);
* **CPU per recycle, measured directly**: what the processes themselves
  count around each recycle: a forked worker's CPU from fork to its first
  message (``time.process_time()``) and an ending worker's from the start of
  its give-back (reset, send or close) to its last atexit function (the means:
  a recycle is one of each); and, against the base's, per recycle, the
  templates' (forks, middle processes, the sessions they open: /proc) and the
  backends' before each worker's first message (``/proc/PID/schedstat``: a
  new backend's start, or a session passed on's reset, and the worker's
  start facts). Left out: the
  dispatcher's share (spawn, pipes, reaping), the kernel's teardown of an
  exiting worker after ``os._exit``, the postmaster's fork of a new backend;
* **CPU per recycle, drain minus base**: (CPU of the drain - CPU of the base)
  / recycles, where CPU is the dispatcher's process tree (the dispatcher, its
  templates, its workers, live or reaped: /proc) plus the PostgreSQL
  postmaster's tree (every backend, live or reaped, and the server's
  background processes), from the dispatcher's start to the drain's end. It
  leaves nothing out, but both drains' CPU varies by a few per cent with the
  machine's load, which at MAX_MESSAGES 1000 is tens of milliseconds per
  recycle: read it over several rounds, on a quiet machine, or with a smaller
  --max-messages. The server tree counts other databases' backends too.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from pepsi_dispatch.devtools.bench.proc import proc_cpu, tree_cpu

#: Where the bench's SDK program notes its connects and its template's forks.
EVENTS_ENV = "PEPSI_BENCH_EVENTS"
#: MAX_MESSAGES of the base drain: no worker reaches it.
NEVER = 1_000_000_000
#: SDK rows of the throughput run (the ones with a template that lends sessions).
SDK_WORKERS = ("sdk-default", "sdk", "sdk-gc")

#: The block the bench's SDK program runs before ``run()`` when EVENTS_ENV is set.
#: Lines (time, pid, what): ``connect`` per successful connect in any of its
#: processes; ``lent`` / ``unlent`` per fork of its template (a waiting session
#: went with the worker, or none); ``start W B C`` per worker at its first
#: message: W its CPU seconds so far (``time.process_time()``: a forked process
#: counts from 0), B its backend's pid and C that backend's CPU seconds so far
#: (``/proc/B/schedstat``, nanoseconds: a new backend counts from its fork), F 1
#: when the template forked it (0: exec'd, its interpreter's start in W);
#: ``giveback W B C`` as it ends (before its session is reset and given back,
#: or closed) and, for a worker that had messages, ``exit W`` last (an atexit
#: function: the SDK's ``leave`` runs them just before ``os._exit``). A few
#: system calls per worker, and one test per message.
EVENTS_HOOK = f"""
_events = os.environ.get("{EVENTS_ENV}")
if _events:
    import atexit
    import psycopg
    from pepsi_dispatch.sdk import entry as _entry, lending as _lending

    def _note(what):
        fd = os.open(_events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, ("%.6f %d %s\\n" % (time.time(), os.getpid(), what)).encode())
        finally:
            os.close(fd)

    _conn = [None]  # this process's session: lent, or its own
    os.register_at_fork(after_in_child=lambda: _conn.__setitem__(0, None))

    def _backend(conn):
        try:
            pid = conn.pgconn.backend_pid
            with open("/proc/%d/schedstat" % pid) as f:
                return "%d %.6f" % (pid, int(f.read().split()[0]) / 1e9)
        except Exception:
            return "0 0"

    _connect = psycopg.connect

    def _noted_connect(*args, **kwargs):
        conn = _connect(*args, **kwargs)
        _conn[0] = conn
        _note("connect")
        return conn

    psycopg.connect = _noted_connect
    _take = _lending.Lender.take

    def _noted_take(self, now):
        loan = _take(self, now)
        _note("lent" if loan is not None and loan.conn is not None else "unlent")
        return loan

    _lending.Lender.take = _noted_take
    _take_lent = _entry.take_lent

    def _noted_take_lent():
        conn = _take_lent()
        if conn is not None:
            _conn[0] = conn
        return conn

    _entry.take_lent = _noted_take_lent
    _give_back = _entry.give_back

    def _noted_give_back(conn):
        _note("giveback %.6f %s" % (time.process_time(), _backend(conn)))
        return _give_back(conn)

    _entry.give_back = _noted_give_back
    _first = [True]  # in the template, so in each worker it forks
    atexit.register(lambda: _first[0] or _note("exit %.6f" % time.process_time()))

    def _noting(handler):
        def noted(msg):
            if _first[0]:
                _first[0] = False
                forked = _lending.loan_in_hand() is not None
                cpu = time.process_time()
                _note("start %.6f %s %d" % (cpu, _backend(_conn[0]), forked))
            return handler(msg)

        return noted

    handlers = {{s: _noting(h) for s, h in handlers.items()}}
"""

_RECYCLED = re.compile(r"stopped \(MAX_MESSAGES \(\d+\) reached\)")


def count_recycles(log_text: str) -> int:
    """Workers the dispatcher's log (INFO) says it stopped at MAX_MESSAGES."""
    return len(_RECYCLED.findall(log_text))


@dataclass
class Events:
    """What the stage program noted up to the drain's end."""

    connects: int = 0
    lent: int = 0
    unlent: int = 0
    #: forked workers that reached their first message, and their CPU seconds
    #: until then (exec'd ones, a first burst's before the template was ready,
    #: are left out: each replacement is forked)
    started: int = 0
    startup_cpu: float = 0.0
    #: workers that reached their first message, forked or exec'd
    workers: int = 0
    #: workers that had messages and ended, their CPU from ``giveback`` to ``exit``
    ended: int = 0
    end_cpu: float = 0.0
    #: the backends' CPU seconds before each worker's first message: a new
    #: backend's all (its start, the worker's start facts), a session passed on
    #: what it used since its previous worker's ``giveback`` (the reset, the facts)
    backend_cpu: float = 0.0
    #: pids of the template processes (the ones that forked)
    templates: set[int] = field(default_factory=set)
    #: when each connect and each end of a worker that had messages was noted
    connect_times: list[float] = field(default_factory=list)
    exit_times: list[float] = field(default_factory=list)

    @property
    def forks(self) -> int:
        return self.lent + self.unlent


def read_events(text: str, until: float) -> Events:
    """The events file's lines up to ``until`` (time.time()); later ones (the
    shutdown's) are not the drain's."""
    out = Events()
    #: per backend pid, its CPU at its last worker's giveback
    handed: dict[int, float] = {}
    #: per worker pid, its CPU at its giveback
    ending: dict[int, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3 or float(parts[0]) > until:
            continue
        pid, what, rest = int(parts[1]), parts[2], parts[3:]
        if what == "connect":
            out.connects += 1
            out.connect_times.append(float(parts[0]))
        elif what in ("lent", "unlent"):
            out.templates.add(pid)
            if what == "lent":
                out.lent += 1
            else:
                out.unlent += 1
        elif what == "start" and rest:
            out.workers += 1
            if len(rest) < 4 or rest[3] == "1":
                out.started += 1
                out.startup_cpu += float(rest[0])
            if len(rest) >= 3 and int(rest[1]):
                backend, cpu = int(rest[1]), float(rest[2])
                out.backend_cpu += cpu - handed.pop(backend, 0.0)
        elif what == "giveback" and rest:
            ending[pid] = float(rest[0])
            if len(rest) == 3 and int(rest[1]):
                handed[int(rest[1])] = float(rest[2])
        elif what == "exit" and rest and pid in ending:
            out.ended += 1
            out.exit_times.append(float(parts[0]))
            out.end_cpu += float(rest[0]) - ending.pop(pid)
    return out


@dataclass
class Drain:
    """One drain's counts for ``--costs``."""

    recycles: int
    events: Events
    #: CPU seconds from the dispatcher's start to the drain's end
    service_cpu: float
    dispatcher_cpu: float
    pg_cpu: float
    #: pg_stat_database.sessions delta over the whole run (shutdown included)
    sessions: int = -1
    #: CPU seconds of the template processes (their middle processes included)
    template_cpu: float = 0.0

    @property
    def cpu(self) -> float:
        return self.service_cpu + self.pg_cpu


def per_recycle(run: Drain, base: Drain) -> dict[str, float]:
    """A drain against its base: CPU per recycle (ms, in all and by part),
    backends started per recycle, the pass-on rate and the share of forks lent
    a session. NaN where there was no recycle."""
    n = run.recycles - base.recycles
    if n <= 0:
        nan = float("nan")
        return dict.fromkeys(
            (
                "cpu_ms",
                "dispatcher_ms",
                "workers_ms",
                "pg_ms",
                "startup_ms",
                "end_ms",
                "template_ms",
                "backend_ms",
                "direct_ms",
                "backends",
                "pass_on",
                "pass_on_later",
                "pass_on_steady",
                "steady_recycles",
                "lent",
            ),
            nan,
        )
    backends = run.events.connects - base.events.connects
    first = base.events.workers  # the first generation: the base's workers
    out = {
        "recycles": float(n),
        "cpu_ms": (run.cpu - base.cpu) / n * 1e3,
        "dispatcher_ms": (run.dispatcher_cpu - base.dispatcher_cpu) / n * 1e3,
        "workers_ms": (
            (run.service_cpu - run.dispatcher_cpu) - (base.service_cpu - base.dispatcher_cpu)
        )
        / n
        * 1e3,
        "pg_ms": (run.pg_cpu - base.pg_cpu) / n * 1e3,
        # measured directly: a forked worker's CPU from fork to first message
        # and an ending worker's from its giveback to its exit (means: each
        # recycle has one of each), and against the base's, the templates'
        # (forking, connecting) and the backends' before a worker's first message
        "startup_ms": _mean(run.events.startup_cpu, run.events.started) * 1e3,
        "end_ms": _mean(run.events.end_cpu, run.events.ended) * 1e3,
        "template_ms": (run.template_cpu - base.template_cpu) / n * 1e3,
        "backend_ms": (run.events.backend_cpu - base.events.backend_cpu) / n * 1e3,
        "backends": backends / n,
        "pass_on": 1.0 - backends / n,
        "pass_on_later": (1.0 - (backends - first) / (n - first) if n > first else float("nan")),
        "lent": run.events.lent / run.events.forks if run.events.forks else float("nan"),
    }
    out["pass_on_steady"], out["steady_recycles"] = steady_pass_on(run.events, 2 * first)
    out["direct_ms"] = sum(out[k] for k in ("startup_ms", "end_ms", "template_ms", "backend_ms"))
    return out


def steady_pass_on(events: Events, skip: int) -> tuple[float, int]:
    """The pass-on rate once ``skip`` workers have ended (the first two
    generations, say): 1 - connects / ends after the ``skip``-th end, and the
    number of ends it counts (NaN and 0 when none is left). No base is needed:
    once the first workers are gone, every connect is a session a recycle did
    not get passed on (a worker connecting itself, or the template opening one)."""
    ends = sorted(events.exit_times)
    if len(ends) <= skip:
        return float("nan"), 0
    since = ends[skip - 1] if skip else float("-inf")
    n = len(ends) - skip
    backends = sum(1 for t in events.connect_times if t > since)
    return 1.0 - backends / n, n


def _mean(total: float, n: int) -> float:
    return total / n if n else 0.0


def postmaster(conn: psycopg.Connection) -> int:
    """The server's postmaster pid when it runs on this machine (0 if not seen)."""
    try:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(stat[1])
    except (OSError, psycopg.Error, IndexError, ValueError):
        return 0


def own_and_reaped_cpu(pid: int) -> float:
    """CPU seconds of process ``pid`` and of its children it reaped (0 if gone)."""
    own, reaped = proc_cpu(pid)
    return own + reaped


def pg_cpu(pid: int) -> float:
    """CPU seconds of the postmaster's tree (NaN when not on this machine)."""
    return tree_cpu(pid)[1] if pid else float("nan")


def sessions(conn: psycopg.Connection) -> int:
    """pg_stat_database.sessions of the current database."""
    row = conn.execute(
        "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    return int(row[0]) if row else -1


def summary_line(label: str, pairs: list[dict[str, float]]) -> str:
    """The median over rounds of each pair's figures, and each round's."""
    good = [p for p in pairs if p.get("recycles", 0) > 0]
    if not good:
        return f"  {label:<11} no recycle (MAX_MESSAGES not reached)"

    def med(key: str) -> float:
        return statistics.median(p[key] for p in good)

    def each(key: str) -> str:
        return " / ".join(f"{p[key]:.1f}" for p in good)

    def each_pct(key: str) -> str:
        return " / ".join(f"{p[key] * 100:.0f}" for p in good)

    return (
        f"  {label:<11} {med('recycles'):.0f} recycles; pass-on {med('pass_on') * 100:.1f}%"
        f" ({med('backends'):.2f} new backends per recycle), after the first generation"
        f" {med('pass_on_later') * 100:.1f}%, once two generations ended"
        f" {med('pass_on_steady') * 100:.1f}% ({each_pct('pass_on_steady')});"
        f" forks lent a session {med('lent') * 100:.0f}%."
        f" CPU per recycle measured directly {med('direct_ms'):.1f} ms ({each('direct_ms')})"
        f" = start-up {med('startup_ms'):.1f} + end {med('end_ms'):.1f}"
        f" + template {med('template_ms'):.1f} + backend {med('backend_ms'):.1f};"
        f" drain minus base {med('cpu_ms'):.1f} ms ({each('cpu_ms')})"
        f" = dispatcher {med('dispatcher_ms'):.1f} + templates and workers"
        f" {med('workers_ms'):.1f} + PostgreSQL {med('pg_ms'):.1f}"
    )


def drain_line(d: Drain) -> str:
    """One drain's counts."""
    e = d.events
    return (
        f"      recycles {d.recycles}, stage program connects {e.connects}"
        f" (server sessions {d.sessions}), template forks {e.forks} (lent a session"
        f" {e.lent}); CPU to the drain's end: dispatcher {d.dispatcher_cpu:.2f} s,"
        f" templates and workers {d.service_cpu - d.dispatcher_cpu:.2f} s, PostgreSQL"
        f" {d.pg_cpu:.2f} s; of which templates {d.template_cpu:.2f} s, {e.started}"
        f" workers' start-up {e.startup_cpu:.3f} s, {e.ended} workers' end"
        f" {e.end_cpu:.3f} s, backends before a first message {e.backend_cpu:.3f} s"
    )


def pair_line(p: dict[str, float]) -> str:
    """One pair's figures (a drain against its base)."""
    if not p.get("recycles", 0) > 0:
        return "      no recycle (MAX_MESSAGES not reached)"
    return (
        f"      per recycle: pass-on {p['pass_on'] * 100:.1f}% ({p['backends']:.2f} new"
        f" backends; after the first generation {p['pass_on_later'] * 100:.1f}%; once two"
        f" generations ended {p['pass_on_steady'] * 100:.1f}% of"
        f" {p['steady_recycles']:.0f});"
        f" CPU measured directly {p['direct_ms']:.1f} ms = start-up {p['startup_ms']:.1f}"
        f" + end {p['end_ms']:.1f} + template {p['template_ms']:.1f}"
        f" + backend {p['backend_ms']:.1f}; drain minus base {p['cpu_ms']:.1f} ms"
        f" = dispatcher {p['dispatcher_ms']:.1f} + templates and workers"
        f" {p['workers_ms']:.1f} + PostgreSQL {p['pg_ms']:.1f}"
    )
