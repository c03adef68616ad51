"""Priorities, dedupe keys, schedules and reschedule with the real dispatcher.

Each test runs `pepsi-dispatch serve` (and pepsi-queue) as subprocesses against its
own database, with real workers and real signals. POLL_INTERVAL is 60 s, so what
happens within the deadlines was driven by notifications, answers and timers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

from dispatch_harness import VENV_BIN, Harness, harness_fixture, wait_until  # noqa: F401

QUEUE = VENV_BIN / "pepsi-queue"


def queue_cli(h: Harness, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(QUEUE), *args],
        env={**os.environ, "PEPSI_DSN": h.dsn, "PEPSI_CONFIG": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )


def add_schedule(conf: Path, name: str, **options: str) -> None:
    text = conf.read_text() + f"\n[schedule-{name}]\n"
    text += "".join(f"{k.upper()} = {v}\n" for k, v in options.items())
    conf.write_text(text)


def start_order(h: Harness, ids: list[int]) -> list[int]:
    """The ids in the order their runs started (the worker log's START lines)."""
    runs = [(r.start, wq) for wq in ids for r in h.wlog().runs_of(wq)]
    return [wq for _start, wq in sorted(runs)]


def test_priorities_in_the_order_a_one_by_one_stage_runs_them(h: Harness) -> None:
    """PARALLELISM 1, QUEUE_LIMIT 1: each claim takes one row; the highest priority
    goes first, equal priorities in enqueue order, negative ones last. A priority
    row claimed before older priority-0 rows must not lift the claim floor past
    them (they would wait for the 60 s heartbeat)."""
    plan = [0, 0, 5, -2, 0, 9, 5, 0]
    ids = [
        h.conn.execute(
            "SELECT pepsi.enqueue('a', %s, priority => %s)", ('{"do": "sleep:0.05;next"}', p)
        ).fetchone()[0]
        for p in plan
    ]
    h.start(h.conf(h.pipeline(["a"], PARALLELISM=1, QUEUE_LIMIT=1)))
    h.wait_all("done", timeout=30)
    ranked = sorted((-p, n, i) for n, (p, i) in enumerate(zip(plan, ids, strict=True)))
    expected = [i for _p, _n, i in ranked]
    assert start_order(h, ids) == expected

    # Later arrivals too: a priority message enqueued behind a backlog overtakes it.
    later = h.conn.execute(
        "SELECT pepsi.enqueue_many('a', %s::jsonb[])", (['{"do": "sleep:0.2;next"}'] * 6,)
    ).fetchall()
    backlog = [r[0] for r in later]
    wait_until(lambda: h.row(backlog[0])["status"] != "pending", 10)
    urgent = h.conn.execute("SELECT pepsi.enqueue('a', '{}', priority => 1)").fetchone()[0]
    h.wait_all("done", timeout=30)
    order = start_order(h, [*backlog, urgent])
    assert order.index(urgent) <= 2, order  # after at most the one or two already taken


def test_dedupe_key_across_a_two_stage_pipeline(h: Harness) -> None:
    """While the keyed message is anywhere in the pipeline (pending, running,
    paused, at either stage) the key returns its id; done, the key is free."""
    h.start(h.conf(h.pipeline(["a", "b"])))
    first = h.conn.execute(
        "SELECT pepsi.enqueue('a', %s, dedupe_key => 'order-17')",
        ('{"do_a": "sleep:1;next", "do_b": "pause_once:1"}',),
    ).fetchone()[0]
    seen: set[tuple[str, str]] = set()
    extra = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = h.row(first)
        if row["status"] == "done":
            break
        again = h.conn.execute(
            "SELECT pepsi.enqueue('a', '{}', dedupe_key => 'order-17')"
        ).fetchone()[0]
        if again != first:
            # Only if the keyed message finished between the read and this
            # enqueue: then the key was free, and this probe made a new message.
            assert h.row(first)["status"] == "done", (row["stage"], row["status"])
            extra = again
            break
        seen.add((row["stage"], row["status"]))
        time.sleep(0.05)
    assert h.row(first)["status"] == "done"
    assert ("a", "running") in seen and ("b", "paused") in seen, seen
    if extra is not None:
        h.wait_all("done", timeout=30)
    n = h.conn.execute("SELECT count(*) FROM pepsi.messages WHERE dedupe_key = 'order-17'")
    assert n.fetchone()[0] == 1 + (extra is not None)
    rc = queue_cli(h, "enqueue", "--key", "order-17", "--priority", "3", "a", '{"n": 2}')
    assert rc.returncode == 0, rc.stderr
    second = int(rc.stdout.split()[0])
    assert second != first
    assert h.row(second)["payload"] == {"n": 2}
    shown = queue_cli(h, "show", str(second))
    assert "  priority    3" in shown.stdout and "  dedupe key  order-17" in shown.stdout
    h.wait_all("done", timeout=30)


def schedule_ticks(h: Harness, stage: str) -> list:
    return [
        r[0]
        for r in h.conn.execute(
            "SELECT (state->>'scheduled_for')::timestamptz FROM pepsi.messages"
            " WHERE stage = %s ORDER BY 1",
            (stage,),
        ).fetchall()
    ]


def test_every_second_with_two_competing_replicas_and_a_restart(h: Harness) -> None:
    """EVERY = 1 s, two competing replicas for about 10 s; one is stopped with SIGTERM
    and started again in between. One message per tick: none doubled, none missing
    (CATCH_UP 0 loses nothing here: the other replica fires while one is down)."""
    conf = h.conf(h.pipeline(["t"]), COMPETING="YES", ORPHAN_TIMEOUT="30 s")
    add_schedule(conf, "pulse", STAGE="t", EVERY="1 s", PAYLOAD='{"from": "pulse"}')
    one = h.start(conf)
    h.start(conf)
    wait_until(lambda: len(schedule_ticks(h, "t")) >= 3, 15, message="3 ticks")
    assert one.terminate() == 0
    time.sleep(2.0)  # one tick or two with only the other replica
    again = h.start(conf)
    wait_until(lambda: len(schedule_ticks(h, "t")) >= 10, 20, message="10 ticks")
    for d in h.dispatchers:
        if d.running():
            assert d.terminate() == 0
    ticks = schedule_ticks(h, "t")
    assert len(ticks) == len(set(ticks)), f"a tick enqueued twice: {ticks}"
    gaps = [b - a for a, b in pairwise(ticks)]
    assert all(g == timedelta(seconds=1) for g in gaps), f"missing ticks: {ticks}"
    assert all(t.microsecond == 0 for t in ticks), ticks
    rows = h.conn.execute("SELECT payload, status FROM pepsi.messages WHERE stage = 't'").fetchall()
    assert {r[0]["from"] for r in rows} == {"pulse"}
    record = h.conn.execute(
        "SELECT last_tick, spec FROM pepsi.schedules() WHERE name = 'pulse'"
    ).fetchone()
    assert record == (ticks[-1], "EVERY 1 s")
    assert "schedules: pulse" in again.log()


def test_catch_up_0_enqueues_only_the_latest_missed_tick(h: Harness) -> None:
    """With no dispatcher running, ticks are missed; the next start enqueues the
    latest of them once (CATCH_UP 0), then every tick again."""
    conf = h.conf(h.pipeline(["t"]))
    add_schedule(conf, "pulse", STAGE="t", EVERY="1 s")
    d = h.start(conf)
    wait_until(lambda: len(schedule_ticks(h, "t")) >= 2, 15, message="2 ticks")
    assert d.terminate() == 0
    before = schedule_ticks(h, "t")
    time.sleep(3.5)  # three or four ticks with no dispatcher
    h.start(conf)
    wait_until(lambda: len(schedule_ticks(h, "t")) >= len(before) + 3, 15, message="ticks")
    after = schedule_ticks(h, "t")
    catch_up = after[len(before)]
    assert catch_up - before[-1] >= timedelta(seconds=3), (before, after)
    gaps = [b - a for a, b in pairwise(after[len(before) :])]
    assert all(g == timedelta(seconds=1) for g in gaps), after


def test_catch_up_n_enqueues_n_missed_ticks_and_the_current_one(h: Harness) -> None:
    """CATCH_UP = 2 (a count, not seconds), EVERY = 2 s, no dispatcher for about 9 s:
    the next start enqueues, in one transaction, the two youngest missed ticks and
    the current one (three consecutive ticks, 4 s of them: read as seconds, 2 would
    have given one or two), and none of the older missed ones."""
    conf = h.conf(h.pipeline(["t"]))
    add_schedule(conf, "pulse", STAGE="t", EVERY="2 s", CATCH_UP="2")
    d = h.start(conf)
    wait_until(lambda: len(schedule_ticks(h, "t")) >= 2, 15, message="2 ticks")
    assert d.terminate() == 0
    before = schedule_ticks(h, "t")
    time.sleep(9.0)  # four or five ticks with no dispatcher
    h.start(conf)
    wait_until(lambda: len(schedule_ticks(h, "t")) > len(before) + 3, 15, message="ticks")
    rows = h.conn.execute(
        "SELECT (state->>'scheduled_for')::timestamptz, created_at FROM pepsi.messages"
        " WHERE stage = 't' AND (state->>'scheduled_for')::timestamptz > %s ORDER BY 1",
        (before[-1],),
    ).fetchall()
    first = [tick for tick, created in rows if created == rows[0][1]]
    assert len(first) == 3, rows
    assert [b - a for a, b in pairwise(first)] == [timedelta(seconds=2)] * 2, first
    assert first[0] - before[-1] >= timedelta(seconds=4), (before, first)


def test_catch_up_0_bounds_the_burst_after_the_dispatcher_was_frozen(h: Harness) -> None:
    """EVERY = 1 s, CATCH_UP 0: a dispatcher frozen (SIGSTOP) for 4 s misses four
    ticks. After SIGCONT it enqueues at most one of them (the current one), not
    all four at once, then every tick again: CATCH_UP bounds every gap, not only
    the ones while no dispatcher ran."""
    conf = h.conf(h.pipeline(["t"]))
    add_schedule(conf, "pulse", STAGE="t", EVERY="1 s")
    d = h.start(conf)
    wait_until(lambda: len(schedule_ticks(h, "t")) >= 2, 15, message="2 ticks")
    os.kill(d.pid, signal.SIGSTOP)
    try:
        frozen = datetime.now(UTC)
        time.sleep(4.0)  # the freeze under test, not a wait for anything
        thawed = datetime.now(UTC)
    finally:
        os.kill(d.pid, signal.SIGCONT)
    wait_until(
        lambda: [t for t in schedule_ticks(h, "t") if t > thawed + timedelta(seconds=2)],
        20,
        message=lambda: f"ticks again after SIGCONT: {schedule_ticks(h, 't')}",
    )
    ticks = schedule_ticks(h, "t")
    burst = [t for t in ticks if frozen < t <= thawed]
    assert len(burst) <= 1, f"{len(burst)} ticks of the freeze enqueued: {ticks}"
    gaps = [b - a for a, b in pairwise(t for t in ticks if t > thawed)]
    assert all(g == timedelta(seconds=1) for g in gaps), ticks
    assert d.terminate() == 0


def test_a_bad_schedule_is_a_configuration_error_with_file_and_line(h: Harness) -> None:
    conf = h.conf(h.pipeline(["t"]))
    add_schedule(conf, "broken", STAGE="t", CRON="61 * * * *")
    line = conf.read_text().splitlines().index("CRON = 61 * * * *") + 1
    d = h.start(conf, wait=False)
    assert d.wait_exit(30) == 2
    assert f"{conf}:{line}: [schedule-broken] CRON = '61 * * * *': not a cron expression" in d.log()


def test_reschedule_from_the_cli(h: Harness) -> None:
    """A message delayed by an hour runs within seconds of `reschedule --now`; a
    done one is refused with a pointer to requeue, a running one as running."""
    h.start(h.conf(h.pipeline(["a"])))
    rc = queue_cli(h, "enqueue", "--in", "1 h", "a", '{"do": "sleep:1;next"}')
    assert rc.returncode == 0, rc.stderr
    mid = int(rc.stdout.split()[0])
    assert h.row(mid)["status"] == "paused"
    later = queue_cli(h, "reschedule", str(mid), "--in", "2 h")
    assert later.returncode == 0, later.stderr
    assert h.row(mid)["status"] == "paused"
    now = queue_cli(h, "reschedule", str(mid), "--now")
    assert now.returncode == 0, now.stderr
    wait_until(lambda: h.row(mid)["status"] == "running", 10, message="the rescheduled run")
    running = queue_cli(h, "reschedule", str(mid), "--now")
    assert running.returncode == 1
    assert "is running at stage a" in running.stderr
    h.wait_all("done", timeout=20)
    assert h.row(mid)["retries"] == 0
    done = queue_cli(h, "reschedule", str(mid))
    assert done.returncode == 1 and "is done" in done.stderr

    fid = h.conn.execute("SELECT pepsi.enqueue('a', '{\"do\": \"sqlfail\"}')").fetchone()[0]
    h.wait_all(["done", "failed"], timeout=20)
    refused = queue_cli(h, "reschedule", str(fid), "--now")
    assert refused.returncode == 1
    assert "requeue it instead" in refused.stderr and "pepsi-queue requeue" in refused.stderr


def test_schedules_command_lists_last_and_next_tick(h: Harness) -> None:
    conf = h.conf(h.pipeline(["t"]))
    add_schedule(conf, "pulse", STAGE="t", EVERY="1 s")
    add_schedule(conf, "nightly", STAGE="t", CRON="30 2 * * *", TIMEZONE="Europe/Berlin")
    h.start(conf)
    wait_until(lambda: schedule_ticks(h, "t"), 15, message="a tick")
    out = queue_cli(h, "-c", str(conf), "schedules")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["SCHEDULE", "STAGE", "TICKS"]
    nightly = next(line for line in lines if line.startswith("nightly"))
    assert "CRON 30 2 * * * (Europe/Berlin)" in nightly and "UTC" in nightly
    pulse = next(line for line in lines if line.startswith("pulse"))
    assert "EVERY 1 s" in pulse and pulse.count("UTC") == 2  # a last and a next tick


def by_schedule(h: Harness) -> dict[str, int]:
    return dict(
        h.conn.execute(
            "SELECT state->>'scheduled_by', count(*) FROM pepsi.messages"
            " WHERE state ? 'scheduled_by' GROUP BY 1"
        ).fetchall()
    )


def test_a_schedule_renamed_then_removed_at_reload(h: Harness) -> None:
    """SIGHUP with [schedule-pulse] renamed to [schedule-beat]: pulse fires no more,
    beat fires from then on (its own record); removed, nothing fires and nothing fails."""
    conf = h.conf(h.pipeline(["t"]))
    base = conf.read_text()
    add_schedule(conf, "pulse", STAGE="t", EVERY="1 s")
    d = h.start(conf)
    wait_until(lambda: by_schedule(h).get("pulse", 0) >= 2, 15, message="pulse ticks")
    conf.write_text(base)
    add_schedule(conf, "beat", STAGE="t", EVERY="1 s")
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: by_schedule(h).get("beat", 0) >= 2, 15, message="beat ticks after reload")
    pulse = by_schedule(h)["pulse"]
    wait_until(lambda: by_schedule(h).get("beat", 0) >= 4, 15, message="beat goes on")
    assert by_schedule(h)["pulse"] == pulse, "the old name fires no more"
    names = {r[0] for r in h.conn.execute("SELECT name FROM pepsi.schedules()").fetchall()}
    assert "beat" in names
    conf.write_text(base)
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "configuration reloaded" in d.log().split("beat")[-1], 15)
    settled = sum(by_schedule(h).values())
    time.sleep(2.5)  # two periods with no schedule: nothing may fire
    assert sum(by_schedule(h).values()) <= settled + 1  # at most the tick in flight
    assert d.running() and h.counts().get("failed", 0) == 0


def scheduled(h: Harness) -> list[tuple[str, datetime, dict]]:
    """(schedule, tick, payload) of every message a schedule enqueued, by tick."""
    return h.conn.execute(
        "SELECT state->>'scheduled_by', (state->>'scheduled_for')::timestamptz, payload"
        " FROM pepsi.messages WHERE state ? 'scheduled_by' ORDER BY 2, 1"
    ).fetchall()


def registered(h: Harness, name: str) -> bool:
    """Is ``name`` a schedule some dispatcher defines (its record has a next tick)?"""
    row = h.conn.execute(
        "SELECT next_tick IS NOT NULL FROM pepsi.schedules() WHERE name = %s", (name,)
    ).fetchone()
    return bool(row and row[0])


def test_a_schedule_only_in_the_overlay_fires_changes_and_stops_at_reload(h: Harness) -> None:
    """[schedule-ov] exists only as pepsi.config rows: it fires; its PAYLOAD changed
    in the overlay (and SIGHUP), the next ticks carry the new one and no tick
    fires twice; its rows deleted (and SIGHUP), it fires no more while the file's
    schedule goes on."""
    conf = h.conf(h.pipeline(["t"]))
    add_schedule(conf, "clock", STAGE="t", EVERY="1 s")
    d = h.start(conf)
    # one statement: a reload that saw half a schedule would end the dispatcher
    h.conn.execute(
        "INSERT INTO pepsi.config (section, option, value) VALUES ('schedule-ov', 'STAGE', 't'),"
        " ('schedule-ov', 'EVERY', '1 s'), ('schedule-ov', 'PAYLOAD', '{\"v\": 1}')"
    )
    wait_until(lambda: sum(1 for s, _, _ in scheduled(h) if s == "ov") >= 2, 15, message="ov ticks")
    h.set_config("schedule-ov", "PAYLOAD", '{"v": 2}')
    d.proc.send_signal(signal.SIGHUP)
    wait_until(
        lambda: [p for s, _, p in scheduled(h) if s == "ov" and p == {"v": 2}],
        15,
        message=lambda: f"ov ticks with the new payload: {scheduled(h)}",
    )
    h.conn.execute("DELETE FROM pepsi.config WHERE section = 'schedule-ov'")
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: not registered(h, "ov"), 15, message="ov no longer defined")
    last_ov = max(t for s, t, _ in scheduled(h) if s == "ov")
    wait_until(
        lambda: sum(1 for s, t, _ in scheduled(h) if s == "clock" and t > last_ov) >= 2,
        15,
        message="two ticks of the file's schedule since",
    )
    rows = scheduled(h)
    ov = [(t, p) for s, t, p in rows if s == "ov"]
    assert max(t for t, _ in ov) == last_ov, "ov fired after it was removed"
    ticks = [t for t, _ in ov]
    assert len(ticks) == len(set(ticks)), f"a tick fired twice: {ov}"
    # the payload changed once: every tick before the change has v 1, every one after v 2
    versions = [p["v"] for _, p in ov]
    assert versions == sorted(versions) and versions[0] == 1 and versions[-1] == 2, ov
    assert d.running() and h.counts().get("failed", 0) == 0


def test_a_schedule_renamed_at_reload_fires_no_tick_under_both_names(h: Harness) -> None:
    """[schedule-pulse] renamed to [schedule-beat], then back to pulse (SIGHUP
    each time): each tick is enqueued once, under one name. The new name starts
    with its next tick; the old name, put back, keeps its record but does not
    enqueue again a tick its other name already did."""
    conf = h.conf(h.pipeline(["t"]))
    base = conf.read_text()
    add_schedule(conf, "pulse", STAGE="t", EVERY="1 s")
    d = h.start(conf)

    def count(name: str) -> int:
        return sum(1 for s, _, _ in scheduled(h) if s == name)

    wait_until(lambda: count("pulse") >= 1, 15, message="a pulse tick")
    conf.write_text(base)
    add_schedule(conf, "beat", STAGE="t", EVERY="1 s")
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: count("beat") >= 1, 15, message="a beat tick after the rename")
    conf.write_text(base)
    add_schedule(conf, "pulse", STAGE="t", EVERY="1 s")
    before = count("pulse")
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: count("pulse") >= before + 2, 15, message="pulse ticks after renaming back")
    rows = scheduled(h)
    ticks = [t for _, t, _ in rows]
    assert len(ticks) == len(set(ticks)), f"a tick enqueued under both names: {rows}"
    assert d.running() and h.counts().get("failed", 0) == 0
