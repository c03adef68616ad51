"""The chaos soak's history checker: pure Python, no database, no processes.

Input is what the soak recorded (see driver.py):

- stage-program events, one dict per log line: ``{"ev": "start"|"tx"|"end", "id",
  "stage", "pid", "did", "t", ...}``; a ``tx`` line also has ``fn`` (advance,
  finish, pause, fail) and ``ret`` (True, False, or None when the statement
  raised, so its outcome is unknown to the program);
- ``last_alive``: for each stage-program process seen dead, the last time it
  was seen alive (a lower bound of its death; the watcher polls /proc), keyed
  by its log file's name without ``.jsonl`` (``"STAGE-PID-STARTTIME"``, the
  events' ``proc``): a pid is reused once the soak has started more processes
  than ``pid_max`` (32768 here), and a later process with the same pid must
  neither extend an earlier run nor merge with it (older evidence: ``"STAGE-PID"``,
  or a bare pid that applies to that pid in any stage);
- ``kills``: ``(pid, t)`` of every SIGKILL the soak sent (a kill excuses only a
  run that had started when it was sent: an earlier process with that pid
  excuses nothing);
- ``declared_dead``: dispatcher id -> when (a time or a list of times) another
  dispatcher's ``reset_orphans`` deleted it from the registry (it was presumed
  dead; a replica may re-register through its heartbeat and be declared dead
  again);
- ``history``: one dict per committed UPDATE of a workqueue row, from a
  trigger: ``{"id", "old_stage", "new_stage", "old_status", "new_status",
  "old_did", "new_did", "t"}``;
- the final rows and statistics.

What it asserts (the dispatcher's guarantees under faults):

1. **No overlap.** No (id, stage) ran in two processes at overlapping times.
   A run is one process's work on one (id, stage): from its first ``start`` to
   its last ``end``/``tx``, or, if it never logged an end, to the last moment
   the process was seen alive (or forever, if it is still alive). Two runs
   overlap when the later one starts before the earlier one ends. Allowed:
   - the earlier process had been SIGKILLed before the later run started;
   - one run's dispatcher had been declared dead (its registry row deleted
     by another dispatcher's reset_orphans) after it claimed the row and no
     later than the other run's start, the other run belongs to another
     dispatcher, and none of the first run's transitions returned true (its
     late write was refused by the fencing token, as the program's own log
     shows). The dead replica's run may be the earlier or the later one: its
     worker may take the id from its pipe only after the rerun began.
2. **No double commit.** No (id, stage) has two committed forward
   transitions (running at stage -> another stage, or done), counted from the
   database history and, separately, from the programs' own logs.
3. **Nothing lost.** Every enqueued id exists and is terminal (done, failed,
   timeout, expired) or legitimately paused (paused, due in the future).
4. **Nothing stranded.** No row is ``running`` once every dispatcher has
   stopped cleanly; while they run, none is ``running`` under a dispatcher id
   that is not live.
5. **Stats agree with rows**, in what kills allow (a SIGKILLed dispatcher
   loses the deltas it had not flushed, so only bounds hold over the whole
   run):
   - over the whole run, a stage's ``processed`` never exceeds the forward
     transitions and pauses committed from that stage (those answer ``0``);
   - over a fault-free tail (between two clean restarts) the deltas are exact:
     each stage's ``processed`` grew by the forward transitions committed from
     it in that window, ``stage_runs`` and ``messages`` by their sum, and
     failed/timeouts/crashes by nothing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

TERMINAL = ("done", "failed", "timeout", "expired")
FORWARD_FNS = ("advance", "finish")


@dataclass
class Run:
    id: int
    stage: str
    pid: int
    proc: str  # STAGE-PID-STARTTIME: one process, though pids are reused
    did: int | None
    start: float
    end: float  # math.inf when the process may still be running it
    ended_cleanly: bool
    txs: list[tuple[str, Any, float]] = field(default_factory=list)  # (fn, ret, t)

    def describe(self) -> str:
        end = "alive" if math.isinf(self.end) else f"{self.end:.3f}"
        how = "" if self.ended_cleanly else " (no end logged)"
        txs = ", ".join(f"{fn}={ret}" for fn, ret, _ in self.txs) or "no transition"
        return f"pid {self.pid} (dispatcher {self.did}) {self.start:.3f}..{end}{how} [{txs}]"


@dataclass
class Violation:
    kind: str  # overlap, double-commit, lost, stranded, stats
    text: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.text}"


@dataclass
class Verdict:
    violations: list[Violation]
    notes: dict[str, int]  # what was allowed and why (counts)

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_kind(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for v in self.violations:
            out[v.kind] += 1
        return dict(out)


# ------------------------------------------------------------------ runs


def build_runs(events: list[dict], last_alive: dict[int | str, float]) -> list[Run]:
    """One Run per delivery of (id, stage) to a process. A process redoing a
    message (a start with no end logged before it: a lost connection) is still
    one run; a start after an end is a new delivery (the message came back
    to the same worker, say after a pause), whose writes are its own."""
    grouped: dict[tuple[int, str, str], list[dict]] = defaultdict(list)
    for ev in events:
        proc = ev.get("proc") or f"{ev['stage']}-{ev['pid']}"
        grouped[(int(ev["id"]), ev["stage"], proc)].append(ev)
    runs = []
    for (mid, stage, proc), evs in grouped.items():
        evs.sort(key=lambda e: e["t"])
        for delivery in _deliveries(evs):
            runs.append(_run_of(mid, stage, proc, delivery, last_alive))
    runs.sort(key=lambda r: (r.id, r.stage, r.start))
    return runs


def _deliveries(evs: list[dict]) -> list[list[dict]]:
    """The events of one process about one (id, stage), cut before each start
    that follows an end; events before the first start are dropped (a log cut
    by a kill mid-line)."""
    out: list[list[dict]] = []
    for e in evs:
        if e["ev"] == "start" and (not out or out[-1][-1]["ev"] == "end"):
            out.append([e])
        elif out:
            out[-1].append(e)
    return out


def _run_of(
    mid: int, stage: str, proc: str, evs: list[dict], last_alive: dict[int | str, float]
) -> Run:
    ends = [e["t"] for e in evs if e["ev"] in ("end", "tx")]
    # A run ended cleanly when its last event is an end (not a start redone later).
    clean = evs[-1]["ev"] == "end"
    pid = int(evs[0]["pid"])
    seen = last_alive.get(proc, last_alive.get(f"{stage}-{pid}", last_alive.get(pid)))
    if clean:
        end = evs[-1]["t"]
    elif seen is not None:
        end = max([seen, *ends])
    else:
        end = math.inf
    txs = [(e["fn"], e.get("ret"), e["t"]) for e in evs if e["ev"] == "tx"]
    return Run(mid, stage, pid, proc, evs[0].get("did"), evs[0]["t"], end, clean, txs)


def claim_times(history: list[dict]) -> dict[tuple[int, str, int], list[float]]:
    """(id, stage, dispatcher) -> when that dispatcher claimed the row at that stage."""
    out: dict[tuple[int, str, int], list[float]] = defaultdict(list)
    for h in history:
        if h["new_status"] == "running" and h["old_status"] != "running":
            out[(int(h["id"]), h["new_stage"], h["new_did"])].append(h["t"])
    for v in out.values():
        v.sort()
    return out


def _fenced_loss(
    x: Run,
    y: Run,
    declared_dead: dict[int, list[float]],
    claims: dict[tuple[int, str, int], list[float]],
) -> float | None:
    """When x's dispatcher was declared dead while holding the row for x, before y began.

    That is: a declaration after x's dispatcher claimed the row (the last claim
    before x started; any time, if the history has none) and no later than y's
    start, y belonging to another dispatcher. None if there is no such declaration.
    """
    if x.did is None or x.did == y.did:
        return None
    before = [t for t in claims.get((x.id, x.stage, x.did), []) if t <= x.start]
    claimed = before[-1] if before else -math.inf
    for td in declared_dead.get(x.did, []):
        if claimed <= td <= y.start:
            return td
    return None


def check_overlaps(
    runs: list[Run],
    kills: list[tuple[int, float]],
    declared_dead: dict[int, list[float]],
    notes: dict[str, int],
    claims: dict[tuple[int, str, int], list[float]] | None = None,
) -> list[Violation]:
    claims = claims or {}
    kill_times: dict[int, list[float]] = defaultdict(list)
    for pid, t in kills:
        kill_times[pid].append(t)
    out = []
    by_key: dict[tuple[int, str], list[Run]] = defaultdict(list)
    for r in runs:
        by_key[(r.id, r.stage)].append(r)
    for (mid, stage), rs in by_key.items():
        rs.sort(key=lambda r: r.start)
        for j, later in enumerate(rs):
            for earlier in rs[:j]:
                if later.start >= earlier.end:
                    continue
                if any(earlier.start <= t <= later.start for t in kill_times[earlier.pid]):
                    notes["overlap allowed: earlier process already killed"] += 1
                    continue
                # Either run may be the one whose dispatcher was declared dead: a dead
                # replica's worker may even start the message after the rerun began.
                fenced = None
                for x, y in ((earlier, later), (later, earlier)):
                    td = _fenced_loss(x, y, declared_dead, claims)
                    if td is not None:
                        fenced = (x, y, td)
                        break
                if fenced is not None:
                    x, y, td = fenced
                    if any(ret is True for _, ret, _ in x.txs):
                        out.append(
                            Violation(
                                "overlap",
                                f"message {mid} stage {stage}: the late write of"
                                f" {x.describe()} was accepted although its dispatcher was"
                                f" declared dead at {td:.3f}; the other run is {y.describe()}",
                            )
                        )
                    else:
                        notes["overlap allowed: dispatcher declared dead, late write fenced"] += 1
                    continue
                out.append(
                    Violation(
                        "overlap",
                        f"message {mid} stage {stage} ran twice at once: {earlier.describe()}"
                        f" and {later.describe()}",
                    )
                )
    return out


# ------------------------------------------------------------------ commits


def forward_commits(history: list[dict]) -> dict[tuple[int, str], list[dict]]:
    """(id, stage) -> the committed updates that moved a running row forward from stage."""
    out: dict[tuple[int, str], list[dict]] = defaultdict(list)
    for h in history:
        if h["old_status"] != "running":
            continue
        moved = h["new_stage"] != h["old_stage"] or h["new_status"] == "done"
        if moved:
            out[(int(h["id"]), h["old_stage"])].append(h)
    return out


def check_double_commits(history: list[dict], events: list[dict]) -> list[Violation]:
    out = []
    for (mid, stage), hs in sorted(forward_commits(history).items()):
        if len(hs) > 1:
            what = "; ".join(
                f"{h['old_status']}@{h['old_stage']}->{h['new_status']}@{h['new_stage']}"
                f" by dispatcher {h['old_did']} at {h['t']:.3f}"
                for h in hs
            )
            out.append(
                Violation(
                    "double-commit", f"message {mid} stage {stage} moved forward twice: {what}"
                )
            )
    logged: dict[tuple[int, str], list[dict]] = defaultdict(list)
    for ev in events:
        if ev["ev"] == "tx" and ev.get("fn") in FORWARD_FNS and ev.get("ret") is True:
            logged[(int(ev["id"]), ev["stage"])].append(ev)
    for (mid, stage), evs in sorted(logged.items()):
        if len({e["pid"] for e in evs}) > 1:
            pids = ", ".join(f"pid {e['pid']} {e['fn']} at {e['t']:.3f}" for e in evs)
            out.append(
                Violation(
                    "double-commit",
                    f"message {mid} stage {stage}: two processes saw their transition"
                    f" apply: {pids}",
                )
            )
    return out


# ------------------------------------------------------------------ rows


def check_rows(
    rows: list[dict],
    enqueued: list[int],
    now: float,
    live_dids: set[int] | None,
) -> list[Violation]:
    """Lost and stranded rows. ``live_dids`` None: every dispatcher has stopped cleanly."""
    out = []
    by_id = {int(r["id"]): r for r in rows}
    for mid in enqueued:
        r = by_id.get(int(mid))
        if r is None:
            out.append(Violation("lost", f"message {mid} was enqueued but its row is gone"))
    for mid, r in sorted(by_id.items()):
        status = r["status"]
        if status in TERMINAL:
            continue
        if status == "paused":
            due = r.get("timeout")
            if due is None or math.isinf(due) or due < now - 30:
                out.append(
                    Violation("lost", f"message {mid} is paused at {r['stage']} and overdue: {due}")
                )
            continue
        if status == "running":
            if live_dids is None or r.get("dispatcher_id") not in live_dids:
                out.append(
                    Violation(
                        "stranded",
                        f"message {mid} is running at {r['stage']} under dispatcher"
                        f" {r.get('dispatcher_id')}, which is not live",
                    )
                )
            continue
        out.append(Violation("lost", f"message {mid} is still {status} at {r['stage']}"))
    return out


# ------------------------------------------------------------------ stats


def check_stats_bounds(stage_stats: dict[str, dict], history: list[dict]) -> list[Violation]:
    """Whole run: processed[stage] <= transitions committed from stage that answer ``0``.

    Those are the forward ones and the pauses (a pause is answered ``0`` too).
    """
    commits: dict[str, int] = defaultdict(int)
    for (_, stage), hs in forward_commits(history).items():
        commits[stage] += len(hs)
    for h in history:
        if h["old_status"] == "running" and h["new_status"] == "paused":
            commits[h["old_stage"]] += 1
    out = []
    for stage, st in sorted(stage_stats.items()):
        if st.get("processed", 0) > commits.get(stage, 0):
            out.append(
                Violation(
                    "stats",
                    f"stage {stage}: processed = {st['processed']} but only"
                    f" {commits.get(stage, 0)} forward transitions and pauses were committed"
                    " from it",
                )
            )
    return out


def check_stats_tail(
    before: dict[str, Any],
    after: dict[str, Any],
    tail_history: list[dict],
) -> list[Violation]:
    """Fault-free tail between two clean stops: the deltas must be exact.

    ``before``/``after``: ``{"stages": {stage: {processed, failed, timeouts,
    crashes}}, "global": {stage_runs, messages, failed, timeouts, crashes}}``.
    ``tail_history``: the committed updates made in the tail.
    """
    commits: dict[str, int] = defaultdict(int)
    for (_, stage), hs in forward_commits(tail_history).items():
        commits[stage] += len(hs)
    out = []
    stages = set(before["stages"]) | set(after["stages"]) | set(commits)
    total = 0
    for stage in sorted(stages):
        b = before["stages"].get(stage, {})
        a = after["stages"].get(stage, {})
        d = a.get("processed", 0) - b.get("processed", 0)
        total += commits.get(stage, 0)
        if d != commits.get(stage, 0):
            out.append(
                Violation(
                    "stats",
                    f"tail: stage {stage} processed grew by {d}, but {commits.get(stage, 0)}"
                    " forward transitions were committed from it",
                )
            )
        for k in ("failed", "timeouts", "crashes"):
            dk = a.get(k, 0) - b.get(k, 0)
            if dk:
                out.append(Violation("stats", f"tail: stage {stage} {k} grew by {dk}, not 0"))
    for k in ("stage_runs", "messages"):
        d = after["global"].get(k, 0) - before["global"].get(k, 0)
        if d != total:
            out.append(
                Violation("stats", f"tail: dispatch_stats.{k} grew by {d}, expected {total}")
            )
    for k in ("failed", "timeouts", "crashes"):
        d = after["global"].get(k, 0) - before["global"].get(k, 0)
        if d:
            out.append(Violation("stats", f"tail: dispatch_stats.{k} grew by {d}, not 0"))
    return out


# ------------------------------------------------------------------ all


def check(
    *,
    events: list[dict],
    last_alive: dict[int | str, float],
    kills: list[tuple[int, float]],
    declared_dead: dict[int, float | list[float]],
    history: list[dict],
    rows: list[dict],
    enqueued: list[int],
    now: float,
    live_dids: set[int] | None = None,
    stage_stats: dict[str, dict] | None = None,
    tail: tuple[dict, dict, list[dict]] | None = None,
) -> Verdict:
    notes: dict[str, int] = defaultdict(int)
    runs = build_runs(events, last_alive)
    dead = {
        did: sorted(ts) if isinstance(ts, list | tuple) else [ts]
        for did, ts in declared_dead.items()
    }
    v = check_overlaps(runs, kills, dead, notes, claim_times(history))
    v += check_double_commits(history, events)
    v += check_rows(rows, enqueued, now, live_dids)
    if stage_stats is not None:
        v += check_stats_bounds(stage_stats, history)
    if tail is not None:
        v += check_stats_tail(*tail)
    notes["runs"] = len(runs)
    return Verdict(v, dict(notes))
