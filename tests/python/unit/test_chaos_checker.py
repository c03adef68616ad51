"""Unit tests of the chaos soak's history checker (tests/chaos/checker.py), hand-made histories."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "chaos"))

import checker  # noqa: E402


def ev(kind, mid, stage, pid, t, did=1, **kw):
    return {"ev": kind, "id": mid, "stage": stage, "pid": pid, "did": did, "t": t, **kw}


def run(mid, stage, pid, t0, t1, did=1, fn="advance", ret=True, end=True):
    out = [ev("start", mid, stage, pid, t0, did)]
    if fn:
        out.append(ev("tx", mid, stage, pid, t1 - 0.01, did, fn=fn, ret=ret))
    if end:
        out.append(ev("end", mid, stage, pid, t1, did))
    return out


def upd(mid, old_stage, new_stage, old_status="running", new_status="pending", t=0.0, did=1):
    return {
        "id": mid,
        "old_stage": old_stage,
        "new_stage": new_stage,
        "old_status": old_status,
        "new_status": new_status,
        "old_did": did,
        "new_did": None,
        "t": t,
    }


def verdict(events=(), last_alive=None, kills=(), dead=None, history=(), rows=(), enq=(), **kw):
    return checker.check(
        events=list(events),
        last_alive=last_alive or {},
        kills=list(kills),
        declared_dead=dead or {},
        history=list(history),
        rows=list(rows),
        enqueued=list(enq),
        now=kw.pop("now", 100.0),
        **kw,
    )


def kinds(v):
    return v.by_kind()


def test_sequential_runs_are_fine():
    events = run(1, "a", 10, 1.0, 2.0, ret=False) + run(1, "a", 11, 2.5, 3.0)
    assert verdict(events).ok


def test_two_processes_at_once_is_an_overlap():
    events = run(1, "a", 10, 1.0, 3.0, ret=False) + run(1, "a", 11, 2.0, 4.0)
    v = verdict(events)
    assert kinds(v) == {"overlap": 1}
    assert "message 1 stage a ran twice at once" in str(v.violations[0])


def test_different_stages_do_not_overlap():
    events = run(1, "a", 10, 1.0, 3.0) + run(1, "b", 11, 2.0, 4.0)
    assert verdict(events).ok


def test_same_process_redoing_a_message_is_one_run():
    events = run(1, "a", 10, 1.0, 2.0, ret=None, end=False) + run(1, "a", 10, 2.5, 3.0)
    assert verdict(events).ok


def test_a_message_back_at_the_same_worker_is_a_new_run():
    # Seen in the soak: dispatcher 12's worker paused message 111 (committed,
    # ended); 12 was declared dead while partitioned, 11 reran the message, and
    # 12's worker got it again later from a claim whose reply came late: that
    # second delivery's write was fenced. The pause of the first delivery is
    # not a late write of the second.
    events = run(111, "a", 20, 26.0, 26.4, did=12, fn="pause", ret=True)
    events += run(111, "a", 21, 31.1, 32.0, did=11)
    events += run(111, "a", 20, 31.7, 39.8, did=12, fn="?", ret=None, end=False)
    history = [upd(111, "a", "a", old_status="pending", new_status="running", t=30.5)]
    history[0]["new_did"] = 12
    v = verdict(events, dead={12: [30.9]}, history=history, last_alive={20: 39.8})
    assert v.ok, v.violations
    assert v.notes["overlap allowed: dispatcher declared dead, late write fenced"] == 1
    # had the second delivery's write gone through, it is a violation
    events[-1]["ret"] = True
    assert "overlap" in kinds(
        verdict(events, dead={12: [30.9]}, history=history, last_alive={20: 39.8})
    )


def test_killed_process_without_end_uses_last_alive():
    events = run(1, "a", 10, 1.0, 9.0, fn=None, end=False) + run(1, "a", 11, 3.0, 4.0)
    assert verdict(events, last_alive={10: 2.9}).ok
    # The process outlived the rerun's start: an overlap.
    assert kinds(verdict(events, last_alive={10: 3.5})) == {"overlap": 1}


def test_process_never_seen_dead_runs_forever():
    events = run(1, "a", 10, 1.0, 9.0, fn=None, end=False) + run(1, "a", 11, 30.0, 31.0)
    assert kinds(verdict(events)) == {"overlap": 1}


def test_kill_before_rerun_is_allowed():
    events = run(1, "a", 10, 1.0, 9.0, fn=None, end=False) + run(1, "a", 11, 3.0, 4.0)
    v = verdict(events, last_alive={10: 3.5}, kills=[(10, 2.0)])
    assert v.ok
    assert v.notes["overlap allowed: earlier process already killed"] == 1
    # A kill after the rerun started does not excuse the overlap.
    assert not verdict(events, last_alive={10: 3.5}, kills=[(10, 3.2)]).ok


def test_declared_dead_dispatcher_fenced_late_write_is_allowed():
    events = run(1, "a", 10, 1.0, 9.0, did=1, ret=False) + run(1, "a", 11, 6.0, 7.0, did=2)
    v = verdict(events, dead={1: 5.0})
    assert v.ok
    assert v.notes["overlap allowed: dispatcher declared dead, late write fenced"] == 1


def test_declared_dead_dispatcher_late_write_accepted_fails():
    events = run(1, "a", 10, 1.0, 9.0, did=1, ret=True) + run(1, "a", 11, 6.0, 7.0, did=2)
    v = verdict(events, dead={1: 5.0})
    assert kinds(v) == {"overlap": 1, "double-commit": 1}
    assert "was accepted" in str(v.violations[0])


def test_declared_dead_after_rerun_started_is_no_excuse():
    events = run(1, "a", 10, 1.0, 9.0, did=1, ret=False) + run(1, "a", 11, 6.0, 7.0, did=2)
    assert not verdict(events, dead={1: 6.5}).ok


def test_declared_dead_but_same_dispatcher_reran_it_fails():
    # A dead-declared replica re-registered and re-claimed the row while its old worker ran.
    events = run(1, "a", 10, 1.0, 9.0, did=1, ret=False) + run(1, "a", 11, 6.0, 7.0, did=1)
    assert kinds(verdict(events, dead={1: 5.0})) == {"overlap": 1}


def test_double_commit_from_history():
    h = [upd(1, "a", "b", t=1.0), upd(1, "a", "b", t=2.0)]
    v = verdict(history=h)
    assert kinds(v) == {"double-commit": 1}


def test_release_and_reclaim_is_not_a_commit():
    h = [
        upd(1, "a", "a", new_status="pending", t=1.0),  # released / reset
        upd(1, "a", "a", old_status="pending", new_status="running", t=1.5),  # claimed
        upd(1, "a", "b", t=2.0),
        upd(1, "b", "b", new_status="done", t=3.0),
    ]
    assert verdict(history=h).ok


def test_double_commit_from_program_logs():
    events = run(1, "a", 10, 1.0, 2.0) + run(1, "a", 11, 3.0, 4.0)
    v = verdict(events)
    assert kinds(v) == {"double-commit": 1}


def test_lost_and_terminal_rows():
    rows = [
        {"id": 1, "stage": "c", "status": "done"},
        {"id": 2, "stage": "b", "status": "failed"},
        {"id": 3, "stage": "a", "status": "pending"},
        {"id": 4, "stage": "a", "status": "paused", "timeout": 110.0},
        {"id": 5, "stage": "a", "status": "paused", "timeout": 10.0},
        {"id": 6, "stage": "a", "status": "paused", "timeout": math.inf},
    ]
    v = verdict(rows=rows, enq=[1, 2, 3, 4, 5, 6, 7], live_dids=set())
    texts = [str(x) for x in v.violations]
    assert kinds(v) == {"lost": 4}
    assert any("message 7 was enqueued but its row is gone" in t for t in texts)
    assert any("message 3 is still pending" in t for t in texts)
    assert any("message 5 is paused" in t for t in texts)
    assert any("message 6 is paused" in t for t in texts)


def test_stranded_running_rows():
    rows = [{"id": 1, "stage": "a", "status": "running", "dispatcher_id": 7}]
    assert verdict(rows=rows, live_dids={7}).ok
    assert kinds(verdict(rows=rows, live_dids={8})) == {"stranded": 1}
    # after every dispatcher stopped cleanly, no row may be running at all
    assert kinds(verdict(rows=rows, live_dids=None)) == {"stranded": 1}


def test_stats_bound():
    h = [upd(1, "a", "b"), upd(2, "a", "a", new_status="paused"), upd(2, "a", "b")]
    assert verdict(history=h, stage_stats={"a": {"processed": 3}}).ok
    v = verdict(history=h, stage_stats={"a": {"processed": 4}})
    assert kinds(v) == {"stats": 1}


def test_stats_tail_exact():
    before = {
        "stages": {"a": {"processed": 5}, "b": {"processed": 5}},
        "global": {"stage_runs": 10, "messages": 10},
    }
    after = {
        "stages": {"a": {"processed": 7}, "b": {"processed": 7}},
        "global": {"stage_runs": 14, "messages": 14},
    }
    tail = [upd(1, "a", "b"), upd(2, "a", "b"), upd(1, "b", "b", new_status="done")]
    tail.append(upd(2, "b", "b", new_status="done"))
    assert verdict(tail=(before, after, tail)).ok
    # a lost flush: processed of b did not grow
    after_bad = {**after, "stages": {"a": {"processed": 7}, "b": {"processed": 6}}}
    v = verdict(tail=(before, after_bad, tail))
    assert kinds(v) == {"stats": 1}
    # a crash counted in a fault-free tail
    after_crash = {**after, "global": {**after["global"], "crashes": 1}}
    assert kinds(verdict(tail=(before, after_crash, tail))) == {"stats": 1}


def test_dead_dispatchers_worker_starting_after_the_rerun_is_allowed_when_fenced():
    # Seen in the soak: dispatcher 68 claimed the row, was declared dead while
    # partitioned, 69 reran it; 68's worker took the id from its pipe later still.
    events = run(103, "b", 20, 39.25, 40.5, did=69) + run(
        103, "b", 21, 39.55, 43.6, did=68, ret=False
    )
    history = [
        upd(103, "b", "b", old_status="pending", new_status="running", t=33.5),
        upd(103, "b", "b", new_status="pending", t=37.8, did=68),
        upd(103, "b", "b", old_status="pending", new_status="running", t=39.1),
        upd(103, "b", "c", t=40.4, did=69),
    ]
    history[0]["new_did"] = 68
    history[2]["new_did"] = 69
    v = verdict(events, dead={68: [37.8]}, history=history)
    assert v.ok, v.violations
    # had its write gone through, it is a violation
    events2 = run(103, "b", 20, 39.25, 40.5, did=69, ret=False)
    events2 += run(103, "b", 21, 39.55, 43.6, did=68, ret=True)
    v = verdict(events2, dead={68: [37.8]}, history=history)
    assert "overlap" in kinds(v)


def test_declared_dead_before_it_claimed_the_row_is_no_excuse():
    # 171 was declared dead at 56, re-registered, claimed the row at 60: it held it legitimately.
    events = run(7, "b", 20, 60.5, 61.0, did=171, ret=False) + run(7, "b", 21, 60.7, 61.5, did=172)
    history = [upd(7, "b", "b", old_status="pending", new_status="running", t=60.4)]
    history[0]["new_did"] = 171
    v = verdict(events, dead={171: [56.0]}, history=history)
    assert kinds(v) == {"overlap": 1}


def test_a_reused_pid_of_another_stage_does_not_keep_a_run_alive():
    """A long soak wraps pids (pid_max): process 10 of stage a ran message 1 and
    died without an end; later a stage b process got pid 10 too. The watcher
    keys what it saw by log file ("a-10", "b-10"): stage a's run ends when a-10
    was last seen, not when b-10 was, so message 1's next run is no overlap."""
    events = [
        ev("start", 1, "a", 10, 0.0, did=1),
        ev("tx", 1, "a", 10, 0.1, did=1, fn="advance", ret=None),
        ev("start", 1, "a", 20, 3.0, did=1),
        ev("tx", 1, "a", 20, 3.1, did=1, fn="advance", ret=True),
        ev("end", 1, "a", 20, 3.2, did=1),
    ]
    assert verdict(events, last_alive={"a-10": 2.0, "b-10": 900.0}).ok
    assert kinds(verdict(events, last_alive={"a-10": 3.5})) == {"overlap": 1}
    # a bare pid still applies to every stage (older evidence files)
    assert kinds(verdict(events, last_alive={10: 900.0})) == {"overlap": 1}


def test_a_reused_pid_in_the_same_stage_is_another_process():
    """Process a-10 (started at tick 100) ran message 1, was killed at 0.5 and
    never logged an end; the rerun went to pid 20 at 1.5..3.0. A later process
    of the same stage got pid 10 again (a-10-900) and started message 1 at 2.0,
    while pid 20 still ran it. Keyed by pid alone, both pid-10 processes were one
    run, excused by the first one's kill: a false pass."""
    events = [
        ev("start", 1, "a", 10, 0.0, proc="a-10-100"),
        ev("start", 1, "a", 20, 1.5, proc="a-20-150"),
        ev("start", 1, "a", 10, 2.0, proc="a-10-900"),
        ev("tx", 1, "a", 10, 2.5, proc="a-10-900", fn="advance", ret=False),
        ev("end", 1, "a", 10, 2.6, proc="a-10-900"),
        ev("tx", 1, "a", 20, 2.9, proc="a-20-150", fn="advance", ret=True),
        ev("end", 1, "a", 20, 3.0, proc="a-20-150"),
    ]
    v = verdict(events, last_alive={"a-10-100": 0.5}, kills=[(10, 0.5)])
    assert kinds(v) == {"overlap": 1}
    # Without the new process the first kill still excuses the first run.
    only_first = [e for e in events if e.get("proc") != "a-10-900"]
    assert verdict(only_first, last_alive={"a-10-100": 0.5}, kills=[(10, 0.5)]).ok


def test_a_kill_of_an_earlier_process_with_that_pid_excuses_nothing():
    events = run(1, "a", 10, 1.0, 9.0, fn=None, end=False) + run(1, "a", 11, 3.0, 4.0)
    # pid 10 was killed at 0.5: another process, before this run began.
    assert kinds(verdict(events, last_alive={10: 3.5}, kills=[(10, 0.5)])) == {"overlap": 1}
