"""The real dispatcher driving stage programs written with the Python worker SDK
(tests/python/support/workers/sdk_scripted_worker.py): stage fusion accounting and
group commit end to end, and the SDK's workers across a kill -9 of their dispatcher.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

import pytest
from dispatch_harness import (  # noqa: F401
    PYTHON,
    ROOT,
    Harness,
    harness_fixture,
    pid_alive,
    read_worker_log,
    wait_until,
)

SDK_WORKER = "tests/python/support/workers/sdk_scripted_worker.py"
RAW_FORKING = "tests/python/support/workers/forking_raw_worker.py"


def sdk_conf(
    h: Harness, group_commit: bool | str, dispatch: dict[str, str] | None = None, **stage_opts
):
    """``group_commit``: True, False, or the scripted worker's flag to pass;
    ``dispatch``: [pepsi-dispatch] options beside the harness's defaults."""
    flag = group_commit if isinstance(group_commit, str) else " --group-commit" * group_commit
    program = f"{PYTHON} {ROOT / SDK_WORKER}" + (f" {flag.strip()}" if flag else "")
    conf_path = h.tmp / "pepsi.conf"
    stages = {
        "a": {"PROGRAM": program, "NEXT": "b", **stage_opts},
        "b": {"PROGRAM": program, "NEXT": "c", **stage_opts},
        "c": {"PROGRAM": program, **stage_opts},
    }
    # the workers read the same file (for NEXT) through -c CONFIG_FILE
    return h.conf(stages, CONFIG_FILE=str(conf_path), **(dispatch or {}))


PLAIN = {
    "plan": {
        "a": {"op": "advance", "to": "b"},
        "b": {"op": "advance", "to": "c"},
        "c": {"op": "finish"},
    }
}
FUSED = {
    "plan": {
        "a": {"op": "advance", "to": "b", "fuse": True},
        "b": {"op": "advance", "to": "c"},
        "c": {"op": "finish"},
    }
}


@pytest.mark.parametrize("group_commit", [False, True], ids=["single", "group-commit"])
def test_sdk_pipeline_with_fusion_and_stats(h: Harness, group_commit: bool) -> None:
    d = h.start(sdk_conf(h, group_commit, PARALLELISM=2, QUEUE_LIMIT=4))
    n_plain, n_fused = 60, 40
    h.enqueue("a", [PLAIN] * n_plain + [FUSED] * n_fused)
    counts = h.wait_all(timeout=90)
    assert counts == {"done": n_plain + n_fused}, counts
    stages = h.conn.execute("SELECT DISTINCT stage FROM pepsi.messages").fetchall()
    assert stages == [("c",)]
    n = n_plain + n_fused
    expected = {"messages": 3 * n_plain + 2 * n_fused, "stage_runs": 3 * n}
    ds = wait_until(
        lambda: h.dispatch_stats()["messages"] == expected["messages"] and h.dispatch_stats(),
        10,
        message=lambda: f"stats {expected}: {h.dispatch_stats()}",
    )
    assert ds["stage_runs"] == expected["stage_runs"], ds
    ss = h.stage_stats()
    assert {s: ss[s]["processed"] for s in "abc"} == {"a": n, "b": n, "c": n}, ss
    assert d.terminate() == 0


def test_sdk_workers_across_kill9(h: Harness) -> None:
    conf = sdk_conf(h, True, PARALLELISM=2, QUEUE_LIMIT=4)
    n = 300
    h.enqueue("a", [PLAIN] * (n // 2) + [FUSED] * (n // 2))
    for _ in range(2):
        d = h.start(conf)
        before = h.counts().get("done", 0)
        wait_until(lambda before=before: h.counts().get("done", 0) >= before + 20, 60)
        workers = [p for pids in d.workers().values() for p in pids]
        d.kill9()
        wait_until(
            lambda workers=workers: not [p for p in workers if pid_alive(p)],
            5,
            message="SDK workers die with their dispatcher",
        )
    d = h.start(conf)
    counts = h.wait_all(timeout=120)
    assert counts == {"done": n}, counts
    assert d.terminate() == 0


@pytest.mark.parametrize("flag", ["--group-commit", "--default-commit"])
def test_sigkilled_group_blames_exactly_the_message_in_hand(h: Harness, flag: str) -> None:
    """A group of 8 whose third handler SIGKILLs its own worker: the dispatcher
    reads the worker's in-hand slot and fails the third message alone; the
    group's seven others (rolled back with the crash, or never started) are
    released and done by the next worker. With the plain protocol the group's
    first, innocent message was failed instead. Under a dispatcher the SDK's
    default is group commit (one transaction for the group)."""
    plans = [{"plan": {"a": {"op": "finish", "insert": f"m{i}"}}} for i in range(8)]
    plans[2] = {"plan": {"a": {"op": "kill", "insert": "killed"}}}
    h.conn.execute("CREATE TABLE public.sdk_log (id bigint, note text)")
    ids = h.enqueue("a", plans)  # all 8 before the start: one claim, one write, one group
    d = h.start(sdk_conf(h, flag, PARALLELISM=1, QUEUE_LIMIT=8))
    counts = h.wait_all(timeout=60, where="stage = 'a'")
    assert counts == {"done": 7, "failed": 1}, (counts, d.tail())
    blamed = h.row(ids[2])
    assert blamed["status"] == "failed"
    assert "SIGKILL" in blamed["state"]["dispatch_error"], blamed["state"]
    assert [h.row(i)["status"] for i in ids[:2] + ids[3:]] == ["done"] * 7
    notes = sorted(n for (n,) in h.conn.execute("SELECT note FROM public.sdk_log"))
    assert notes == sorted(f"m{i}" for i in range(8) if i != 2)  # each committed once
    assert "its handler was running" in d.log()
    assert d.terminate() == 0  # flushes the statistics
    assert h.stage_stats()["a"]["crashes"] == 1
    # one group: the first two were rolled back with the crash and handed out
    # again (8 + 7 ids); one commit per message would have answered them (8 + 5)
    assert h.dispatch_stats()["messages"] == 15


def test_max_runtime_times_out_only_the_hanging_message_in_hand(h: Harness) -> None:
    """The SDK at its defaults (group commit with the in-hand slot), QUEUE_LIMIT 8,
    MAX_RUNTIME 4 s: three good messages, one whose handler never returns, three
    good ones, all in one group. MAX_RUNTIME blames the message in hand: it
    alone ends 'timeout'. The three before it (their handlers returned, but
    their group never committed) and the three after it are released and done
    by the next worker. Blaming the head of line instead timed out the three
    innocent messages ahead of it, one per MAX_RUNTIME, before the hang itself."""
    plans = [{"plan": {"a": {"op": "finish", "insert": f"m{i}"}}} for i in range(7)]
    plans[3] = {"plan": {"a": {"op": "finish", "sleep": 3600}}}
    h.conn.execute("CREATE TABLE public.sdk_log (id bigint, note text)")
    ids = h.enqueue("a", plans)  # all 7 before the start: one claim, one write, one group
    conf = sdk_conf(h, "--default-commit", {"MAX_RUNTIME": "4 s"}, PARALLELISM=1, QUEUE_LIMIT=8)
    d = h.start(conf)
    counts = h.wait_all(timeout=90, where="stage = 'a'")
    assert counts == {"done": 6, "timeout": 1}, (counts, d.tail())
    hung = h.row(ids[3])
    assert hung["status"] == "timeout", hung
    assert "MAX_RUNTIME" in hung["state"]["dispatch_error"], hung["state"]
    assert [h.row(i)["status"] for i in ids[:3] + ids[4:]] == ["done"] * 6
    notes = sorted(n for (n,) in h.conn.execute("SELECT note FROM public.sdk_log"))
    assert notes == sorted(f"m{i}" for i in range(7) if i != 3)  # each committed once
    assert "timed out (its handler was running)" in d.log(), d.tail()
    assert d.terminate() == 0  # flushes the statistics
    stats = h.stage_stats()["a"]
    assert (stats["timeouts"], stats["processed"]) == (1, 6), stats


def test_a_handler_stuck_in_sql_past_max_runtime_stalls_no_other_stage(h: Harness) -> None:
    """A handler stuck in a long statement (pg_sleep here; a slow query, a lock
    wait) holds its group's rows locked (the pin). MAX_RUNTIME kills the
    worker, but a backend busy in a statement did not notice its client was
    gone until the statement ended, so the dispatcher's timeout record and
    release of those rows waited on the locks (lock_timeout, 10 s, then again)
    and every other stage stalled. SDK sessions now check for their client
    while a statement runs (client_connection_check_interval), so the backend
    ends within a second and releases the rows."""
    stuck = h.enqueue("a", [{"plan": {"a": {"op": "finish", "sql_sleep": 120}}}])[0]
    conf = sdk_conf(h, "--default-commit", {"MAX_RUNTIME": "2 s"}, PARALLELISM=1, QUEUE_LIMIT=4)
    d = h.start(conf)
    wait_until(lambda: "timed out" in d.log(), 30, message=lambda: d.tail())
    others = h.enqueue("c", [{"plan": {"c": {"op": "finish"}}}] * 5)
    t0 = time.monotonic()
    wait_until(
        lambda: all(h.row(i)["status"] == "done" for i in others),
        30,
        message=lambda: f"stage c's messages done: {h.counts()} {d.tail()}",
    )
    took = time.monotonic() - t0
    assert took < 5, f"{took:.1f} s: the loop waited on the stuck backend's locks"
    assert h.row(stuck)["status"] == "timeout", h.row(stuck)
    assert "lock timeout" not in d.log().lower(), d.tail()


def _most_at_once(runs: list) -> int:
    """The most handler runs (START..END) open at one moment, over all workers."""
    events = sorted([(r.start, 1) for r in runs] + [(r.end, -1) for r in runs])
    most = now = 0
    for _, delta in events:
        now += delta
        most = max(most, now)
    return most


def _most_workers_at_once(runs: list) -> int:
    """The most workers with a handler run open at one moment."""
    events = sorted([(r.start, 1, r.pid) for r in runs] + [(r.end, -1, r.pid) for r in runs])
    open_runs: dict[int, int] = {}
    most = 0
    for _, delta, pid in events:
        open_runs[pid] = open_runs.get(pid, 0) + delta
        most = max(most, sum(1 for v in open_runs.values() if v > 0))
    return most


def test_template_forks_recycled_workers_within_the_bounds(h: Harness) -> None:
    """An SDK stage's first worker forks the stage's template from itself (the
    offer), so no second interpreter starts: the replacements at MAX_MESSAGES
    are forked by it, not exec'd. Every message runs once, in one worker, never
    more than PARALLELISM at once, at most MAX_MESSAGES per worker; a SIGKILLed
    dispatcher takes the forked workers and the template with it."""
    log = h.tmp / "sdk.log"
    program = f"{PYTHON} {ROOT / SDK_WORKER} --default-commit --log {log}"
    p, limit, n = 2, 10, 300
    stages = {"a": {"PROGRAM": program, "PARALLELISM": p, "QUEUE_LIMIT": 4, "MAX_MESSAGES": limit}}
    conf = h.conf(stages, CONFIG_FILE=str(h.tmp / "pepsi.conf"), WORKER_IDLE_TIMEOUT="60 s")
    d = h.start(conf)
    ids = h.enqueue("a", [{"plan": {"a": {"op": "finish", "sleep": 0.002}}}] * n)
    assert h.wait_all(timeout=90) == {"done": n}
    text = d.log()
    assert "template process pid" in text and "forked by the stage's first worker" in text, text
    assert not re.search(r"template process pid \d+ started", text), "no template was exec'd"
    forked = [int(x.split()[0]) for x in text.split("worker pid ")[1:] if "forked by" in x[:40]]
    started = re.findall(r"worker pid \d+ (started|forked by)", text)
    # the first PARALLELISM workers are exec'd (the first one forks the template);
    # a replacement may be exec'd only if it is due before the template greets
    assert started.count("started") <= p + 1, text
    assert len(forked) >= n // limit - p - 1, text
    runs = read_worker_log(log).runs
    assert sorted(r.wq_id for r in runs) == sorted(ids)  # each id ran once
    per_pid: dict[int, int] = {}
    for r in runs:
        per_pid[r.pid] = per_pid.get(r.pid, 0) + 1
    assert max(per_pid.values()) <= limit, per_pid
    assert set(forked) & set(per_pid), "forked workers ran messages"
    assert _most_at_once(runs) <= p
    # the workers and the template are the dispatcher's children; kill -9 it
    alive = [pid for pids in d.workers().values() for pid in pids]
    assert set(alive) & set(forked), (alive, forked)
    assert len(alive) >= 2  # the template and at least one idle forked worker
    d.kill9()
    wait_until(
        lambda: not [pid for pid in alive if pid_alive(pid)],
        5,
        message="forked workers and the template die with their dispatcher",
    )


def test_a_protocol_worker_with_fork_point_is_forked_within_the_bounds(h: Harness) -> None:
    """A program that speaks the protocol itself and calls fork_point() gets a
    template too: its replacements at MAX_MESSAGES are forked. Every message
    runs once, never more than PARALLELISM at once, at most MAX_MESSAGES per
    worker, and the forked workers die with a SIGKILLed dispatcher."""
    log = h.tmp / "raw.log"
    program = f"{PYTHON} {ROOT / RAW_FORKING} --log {log}"
    p, limit, n = 2, 10, 300
    stages = {"a": {"PROGRAM": program, "PARALLELISM": p, "QUEUE_LIMIT": 4, "MAX_MESSAGES": limit}}
    d = h.start(h.conf(stages, WORKER_IDLE_TIMEOUT="60 s"))
    ids = h.enqueue("a", n)
    assert h.wait_all(timeout=90) == {"done": n}
    text = d.log()
    assert "template process pid" in text, text
    forked = [int(x.split()[0]) for x in text.split("worker pid ")[1:] if "forked by" in x[:40]]
    # the first replacements may be exec'd while the template is still starting;
    # once it is up, the later ones are forked
    assert len(forked) >= n // limit // 2, text
    started = re.findall(r"worker pid \d+ (started|forked by)", text)
    assert started[-3:] == ["forked by"] * 3, text
    runs = read_worker_log(log).runs
    assert sorted(r.wq_id for r in runs) == sorted(ids)  # each id ran once
    per_pid: dict[int, int] = {}
    for r in runs:
        per_pid[r.pid] = per_pid.get(r.pid, 0) + 1
    assert max(per_pid.values()) <= limit, per_pid
    assert set(forked) & set(per_pid), "forked workers ran messages"
    assert _most_workers_at_once(runs) <= p
    alive = [pid for pids in d.workers().values() for pid in pids]
    assert set(alive) & set(forked), (alive, forked)
    d.kill9()
    wait_until(
        lambda: not [pid for pid in alive if pid_alive(pid)],
        5,
        message="forked workers and the template die with their dispatcher",
    )


def _worker_starts(text: str) -> list[tuple[float, str]]:
    """(seconds of the log's clock, 'started' or 'forked by') of each worker start."""
    out = []
    for m in re.finditer(
        r"^\S+ \d\d:(\d\d):(\d\d\.\d+)\S* .*worker pid \d+ (started|forked by)", text, re.M
    ):
        out.append((int(m.group(1)) * 60 + float(m.group(2)), m.group(3)))
    return out


def test_the_first_burst_forks_all_its_workers_from_the_probes_template(h: Harness) -> None:
    """At start, before any message, the stage's template probe (a worker handed
    nothing, stopped at once) forks the template from itself; the first burst
    then forks all its workers, none imports an interpreter inside the burst.
    Every message runs once, never more than PARALLELISM at once."""
    log = h.tmp / "sdk.log"
    program = f"{PYTHON} {ROOT / SDK_WORKER} --default-commit --log {log}"
    p, n = 4, 200
    stages = {"a": {"PROGRAM": program, "PARALLELISM": p, "QUEUE_LIMIT": 4}}
    conf = h.conf(stages, CONFIG_FILE=str(h.tmp / "pepsi.conf"), WORKER_IDLE_TIMEOUT="60 s")
    d = h.start(conf)
    wait_until(
        lambda: (
            "forked by the stage's first worker" in d.log()
            and "stopped (template probe, handed nothing): exited with code 0" in d.log()
        ),
        30,
        message="the probe forks the template and exits",
    )
    ids = h.enqueue("a", [{"plan": {"a": {"op": "finish", "sleep": 0.01}}}] * n)
    assert h.wait_all(timeout=90) == {"done": n}
    starts = [kind for _, kind in _worker_starts(d.log())]
    assert starts == ["started"] + ["forked by"] * p, d.log()
    runs = read_worker_log(log).runs
    assert sorted(r.wq_id for r in runs) == sorted(ids)  # each id ran once
    assert len({r.pid for r in runs}) == p  # the forked workers took their share
    assert _most_at_once(runs) <= p


def test_a_reload_probes_a_stage_that_had_a_template_again(h: Harness) -> None:
    """A reload ends the stage's template (its configuration is the old one) and
    probes again, since the stage's program was one: the next burst is forked
    by the new template. A plain program's stage is not probed again."""
    log = h.tmp / "sdk.log"
    sdk = f"{PYTHON} {ROOT / SDK_WORKER} --default-commit --log {log}"
    stages = {
        "a": {"PROGRAM": sdk, "PARALLELISM": 2, "QUEUE_LIMIT": 4},
        "b": {"PROGRAM": h.program(), "PARALLELISM": 1},
    }
    conf = h.conf(stages, CONFIG_FILE=str(h.tmp / "pepsi.conf"), WORKER_IDLE_TIMEOUT="60 s")
    d = h.start(conf)
    probe = "to fork the stage's template before its first message"
    ended = "stopped (template probe, handed nothing): exited with code 0"

    def probed() -> list[str]:
        return [ln.split(": worker pid")[0][-7:] for ln in d.log().splitlines() if probe in ln]

    wait_until(lambda: d.log().count(ended) == 2, 30, message=lambda: "both probes\n" + d.tail())
    assert sorted(probed()) == ["stage a", "stage b"], d.log()
    h.set_config("stage-a", "MAX_RETRIES", "7")  # any change: a reload
    wait_until(lambda: d.log().count(ended) == 3, 30, message=lambda: "a's probe\n" + d.tail())
    assert sorted(probed()) == ["stage a", "stage a", "stage b"], d.log()
    text = d.log()
    h.enqueue("a", [{"plan": {"a": {"op": "finish"}}}] * 20)
    assert h.wait_all(timeout=60) == {"done": 20}
    after = d.log()[len(text) :]
    assert "forked by the stage's template" in after and " started (" not in after, after


def test_a_plain_protocol_programs_probe_ends_quietly_and_costs_its_stage_nothing(
    h: Harness,
) -> None:
    """The template probe of a program that is not a template (a plain protocol
    worker) reads EOF and exits 0: no template, no cooldown, no warning, nothing
    run or failed; the stage's first messages then run as before, in workers
    started by exec (the offer is made again, and again not taken)."""
    log = h.tmp / "w.log"
    d = h.start(h.conf({"a": {"PROGRAM": f"{h.program()} --log {log}", "PARALLELISM": 2}}))
    wait_until(
        lambda: "stopped (template probe, handed nothing): exited with code 0" in d.log(),
        30,
        message="the probe exits 0",
    )
    text = d.log()
    assert "holding off" not in text and "template process" not in text, text
    assert not [ln for ln in text.splitlines() if " WARNING " in ln and "SERVICE_USER" not in ln]
    assert not log.exists() or not read_worker_log(log).runs  # it ran nothing
    h.enqueue("a", 6)
    assert h.wait_all(timeout=60) == {"done": 6}
    assert len(read_worker_log(log).runs) == 6
    starts = [kind for _, kind in _worker_starts(d.log())]
    assert starts[0] == "started" and set(starts) == {"started"}, d.log()


def test_a_program_that_takes_no_offer_delays_its_first_burst_by_the_hold_at_most(
    h: Harness,
) -> None:
    """The burst waits for a template only briefly: a plain protocol worker that
    starts slowly (2 s before it reads) and is offered the template first (the
    stage's template probe, started with the dispatcher) has its stage's other
    workers exec'd after the hold (0.5 s), not after the probe's end."""
    program = f"{h.program()} --startup-delay 2"
    p = 4
    d = h.start(h.conf({"a": {"PROGRAM": program, "PARALLELISM": p, "QUEUE_LIMIT": 1}}))
    h.enqueue("a", 8)
    assert h.wait_all(timeout=60) == {"done": 8}
    text = d.log()
    starts = _worker_starts(text)
    assert "started (1/4) to fork the stage's template before its first message" in text, text
    assert [kind for _, kind in starts] == ["started"] * len(starts), text
    first = starts[0][0]  # the probe, which holds a slot until it exits (2 s)
    later = [t - first for t, _ in starts[1:p]]
    assert len(later) == p - 1 and all(0.3 < dt < 1.8 for dt in later), (later, text)


def _state(pid: int) -> str:
    """The one-letter state of process ``pid`` (/proc/PID/stat); "gone" once reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    return stat[stat.rfind(")") + 2]


def test_a_stopped_template_does_not_hold_the_loop(h: Harness) -> None:
    """A template already stopped (SIGSTOP, a debugger) answers no spawn: the
    next one held the loop for SPAWN_TIMEOUT (5 s) before it gave up. The
    dispatcher sees it stopped and execs the replacement at once; every message
    still runs once."""
    log = h.tmp / "sdk.log"
    program = f"{PYTHON} {ROOT / SDK_WORKER} --default-commit --log {log}"
    stages = {"a": {"PROGRAM": program, "PARALLELISM": 1, "QUEUE_LIMIT": 1, "MAX_MESSAGES": 3}}
    conf = h.conf(stages, CONFIG_FILE=str(h.tmp / "pepsi.conf"), WORKER_IDLE_TIMEOUT="60 s")
    d = h.start(conf)
    h.enqueue("a", [{"plan": {"a": {"op": "finish"}}}])
    found = wait_until(
        lambda: re.search(r"template process pid (\d+) forked by", d.log()), 30, message="template"
    )
    template = int(found.group(1))
    h.wait_all(timeout=30)
    wait_until(lambda: len(d.workers().get("a", [])) >= 2, 10, message="worker and template up")
    os.kill(template, signal.SIGSTOP)
    try:
        # A spawn the dispatcher had just sent (a warm spare) finds it stopped
        # too: the template is then ended at once, before the test goes on.
        wait_until(lambda: _state(template) in ("T", "gone"), 5, message="the template stopped")
        t0 = time.monotonic()
        ids = h.enqueue("a", [{"plan": {"a": {"op": "finish"}}}] * 6)  # two recycles
        h.wait_all(timeout=60)
        took = time.monotonic() - t0
        assert re.search(
            f"template pid {template} (is stopped|was stopped during a spawn)", d.log()
        ), d.tail()
        assert took < 4, f"{took:.1f} s: a spawn waited on the stopped template"
        runs = [r.wq_id for r in read_worker_log(log).runs if r.wq_id in set(ids)]
        assert sorted(runs) == sorted(ids)
    finally:
        with contextlib.suppress(ProcessLookupError):  # closed: the stage execs now
            os.kill(template, signal.SIGCONT)
