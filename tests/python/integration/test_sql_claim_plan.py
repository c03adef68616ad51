"""pepsi.claim on a table of 1,000,000 rows: the plan, the time, the dead-entries trap.

The claim runs on every dispatcher wake, so its plan is tested, not eyeballed:
auto_explain (nested statements, JSON) captures the plan PostgreSQL really uses
inside the PL/pgSQL function, for the small-backlog and the large-backlog case.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from conftest import alembic
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parents[3]
STAGES = [f"s{i}" for i in range(8)]
CAPS16 = [16] * 8


@pytest.fixture(scope="module")
def big_dsn(pg_admin_dsn: str, template_db: str) -> Iterator[str]:
    """A migrated database with 1,000,000 rows: 880k done, 60k pending, 60k paused."""
    name = f"pepsi_big_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    dsn = make_conninfo(pg_admin_dsn, dbname=name)
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            # Stage i % 8; per stage, in every 100 consecutive ids: 88 done,
            # 6 pending, 6 paused (an hour away), so pending rows sit between
            # done ones all along the table, as they do in a live queue.
            c.execute(
                """
                INSERT INTO pepsi.workqueue (stage, status, timeout, created_at, updated_at)
                SELECT 's' || (i % 8),
                       CASE WHEN (i / 8) % 100 < 88 THEN 'done'
                            WHEN (i / 8) % 100 < 94 THEN 'pending' ELSE 'paused' END,
                       CASE WHEN (i / 8) % 100 >= 94 THEN now() + interval '1 hour' END,
                       now() - interval '2 days', now() - interval '1 day'
                  FROM generate_series(1, 1000000) AS i
                """
            )
            c.execute("VACUUM ANALYZE pepsi.workqueue")
        yield dsn
    finally:
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _nodes(plan: dict) -> Iterator[dict]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def captured_plans(conn: psycopg.Connection, statements: list[tuple[str, tuple]]) -> list[dict]:
    """Plans (auto_explain, JSON, ANALYZE) of every statement the given ones run, rolled back."""
    plans: list[dict] = []

    def on_notice(diag: psycopg.errors.Diagnostic) -> None:
        text = diag.message_primary or ""
        if "plan:" in text:
            plans.append(json.loads(text.split("plan:", 1)[1]))

    conn.add_notice_handler(on_notice)
    try:
        with conn.transaction(force_rollback=True):
            conn.execute("LOAD 'auto_explain'")
            for setting in (
                "auto_explain.log_min_duration = 0",
                "auto_explain.log_nested_statements = on",
                "auto_explain.log_analyze = on",
                "auto_explain.log_buffers = on",
                "auto_explain.log_format = json",
                "client_min_messages = log",
            ):
                conn.execute(f"SET LOCAL {setting}")
            for query, params in statements:
                conn.execute(query, params).fetchall()
            conn.execute("SET LOCAL client_min_messages = notice")
    finally:
        conn.remove_notice_handler(on_notice)
    return plans


def claim_plans(
    conn: psycopg.Connection,
    caps: list[int],
    skip_locked: bool = False,
    after_ids: list[int | None] | None = None,
) -> list[dict]:
    """Plans of the UPDATE inside one claim (rolled back)."""
    if after_ids is None:  # the 4-argument call (v1 has no after_ids)
        call = ("SELECT * FROM pepsi.claim(1, %s, %s, %s)", (STAGES, caps, skip_locked))
    else:
        call = (
            "SELECT * FROM pepsi.claim(1, %s, %s, %s, %s::bigint[])",
            (STAGES, caps, skip_locked, after_ids),
        )
    plans = captured_plans(conn, [call])
    update = [p for p in plans if "UPDATE pepsi.workqueue" in p.get("Query Text", "")]
    moved = [n for p in update for n in _nodes(p["Plan"]) if n["Node Type"] == "ModifyTable"]
    assert moved and moved[0]["Actual Rows"] > 0, "the claim returned nothing"
    return update


def scans(plans: list[dict]) -> list[tuple[str, str | None, str | None]]:
    return [
        (n["Node Type"], n.get("Relation Name"), n.get("Index Name"))
        for p in plans
        for n in _nodes(p["Plan"])
        if "Scan" in n["Node Type"]
    ]


def assert_index_plan(plans: list[dict]) -> None:
    assert len(plans) == 1, "one UPDATE statement claims for every stage"
    found = scans(plans)
    assert not [s for s in found if s[0] == "Seq Scan"], f"sequential scan in the claim: {found}"
    index_names = {s[2] for s in found}
    assert "workqueue_pending_idx" in index_names, f"pick does not walk the partial index: {found}"
    assert "workqueue_pkey" in index_names, f"update does not find rows by primary key: {found}"
    update = next(n for n in _nodes(plans[0]["Plan"]) if n["Node Type"] == "ModifyTable")
    assert update["Actual Rows"] == 0 or update["Operation"] == "Update"


def best_claim_ms(conn: psycopg.Connection, caps: list[int], runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        with conn.transaction(force_rollback=True):
            t0 = time.perf_counter()
            n = len(conn.execute("SELECT * FROM pepsi.claim(1, %s, %s)", (STAGES, caps)).fetchall())
            best = min(best, (time.perf_counter() - t0) * 1000)
        assert n == sum(caps)
    return best


def test_claim_walks_the_partial_index_and_updates_by_primary_key(big_dsn: str) -> None:
    with psycopg.connect(big_dsn, autocommit=True) as conn:
        for skip_locked in (False, True):
            plans = claim_plans(conn, CAPS16, skip_locked)
            assert_index_plan(plans)


def test_claim_of_8_stages_x_16_rows_is_fast(big_dsn: str, record_property) -> None:
    with psycopg.connect(big_dsn, autocommit=True) as conn:
        ms = best_claim_ms(conn, CAPS16)
    record_property("claim_8x16_ms", round(ms, 2))
    print(f"\none claim of 8 stages x 16 rows on 1,000,000 rows: {ms:.2f} ms (best of 5)")
    assert ms < 50, f"claim took {ms:.1f} ms"


def test_large_backlog_keeps_the_index_plan_where_v1_scanned_the_table(big_dsn: str) -> None:
    with psycopg.connect(big_dsn, autocommit=True) as conn:
        with conn.transaction(force_rollback=True):
            # 440,000 more pending rows (500,000 in all): the planner's guess for
            # LIMIT cap becomes large enough to tempt a hash join.
            conn.execute(
                "UPDATE pepsi.workqueue SET status = 'pending'"
                " WHERE status = 'done' AND workqueue_id % 2 = 0"
            )
            conn.execute("ANALYZE pepsi.workqueue")
            assert_index_plan(claim_plans(conn, CAPS16))

            # The same situation with claim v1 (UPDATE ... FROM a materialized CTE):
            # this is the regression v2 fixed, so the test proves it can see it.
            # (v4 has a fifth parameter: drop it, or the 4-argument call is ambiguous.)
            conn.execute("DROP FUNCTION pepsi.claim(bigint, text[], integer[], boolean, bigint[])")
            conn.execute((ROOT / "migrations/sql/functions/claim.v1.sql").read_text())
            v1 = scans(claim_plans(conn, CAPS16))
            assert ("Seq Scan", "workqueue", None) in v1, f"v1 plan changed: {v1}"
        # The rolled-back UPDATE left 440,000 aborted entries in the pending
        # index; leave the table as the other tests expect it.
        conn.execute("VACUUM ANALYZE pepsi.workqueue")


def pick_buffers(plans: list[dict]) -> int:
    """Buffers the per-stage pick read from the partial pending index (all loops)."""
    return sum(
        n["Shared Hit Blocks"] + n["Shared Read Blocks"]
        for n in _nodes(plans[0]["Plan"])
        if n.get("Index Name") == "workqueue_pending_idx"
    )


def test_claims_after_a_burst_of_50000_stay_fast(big_dsn: str, record_property) -> None:
    """Every claimed row leaves a dead entry in the partial pending index.

    The next scan marks entries of committed claims dead (kill_prior_tuple), so a
    burst does not slow later claims down; an open old snapshot would keep them
    alive (see docs/SQL.md for the numbers).
    """
    with psycopg.connect(big_dsn, autocommit=True) as conn:
        before = best_claim_ms(conn, CAPS16, runs=3)
        buffers_before = pick_buffers(claim_plans(conn, CAPS16))
        claimed = 0
        while claimed < 50_000:  # bursts as the dispatcher makes them: 8 x 16, committed
            n = len(
                conn.execute("SELECT * FROM pepsi.claim(2, %s, %s)", (STAGES, CAPS16)).fetchall()
            )
            assert n == 128, "the table ran out of pending rows"
            claimed += n
        t0 = time.perf_counter()
        conn.execute("SELECT * FROM pepsi.claim(3, %s, %s)", (STAGES, CAPS16)).fetchall()
        first_after = (time.perf_counter() - t0) * 1000
        after = best_claim_ms(conn, CAPS16, runs=3)
        plans = claim_plans(conn, CAPS16)
    buffers_after = pick_buffers(plans)
    record_property("claim_before_burst_ms", round(before, 2))
    record_property("claim_after_burst_ms", round(after, 2))
    print(
        f"\nclaim 8x16: {before:.2f} ms and {buffers_before} pick buffers before;"
        f" {first_after:.2f} ms first after claiming {claimed} rows;"
        f" then {after:.2f} ms and {buffers_after} pick buffers"
    )
    assert_index_plan(plans)
    assert after < 50, f"claim after the burst took {after:.1f} ms"


def test_after_ids_bound_is_an_index_condition_of_the_pick(big_dsn: str) -> None:
    """v4: the per-stage bound starts the pending-index scan (it is not a filter)."""
    with psycopg.connect(big_dsn, autocommit=True) as conn:
        lows = conn.execute(
            "SELECT stage, min(workqueue_id) FROM pepsi.workqueue WHERE status = 'pending'"
            " GROUP BY stage"
        ).fetchall()
        low = dict(lows)
        after_ids = [low.get(s) for s in STAGES]
        after_ids[1] = None  # a NULL entry: no bound for that stage
        for skip_locked in (False, True):
            plans = claim_plans(conn, CAPS16, skip_locked, after_ids)
            assert_index_plan(plans)
            nodes = _nodes(plans[0]["Plan"])
            picks = [n for n in nodes if n.get("Index Name") == "workqueue_pending_idx"]
            # v5: one range scan per priority band; the bound starts the priority-0 one.
            # v8: the band is the range priority >= 0 AND priority <= 0 (see below).
            zero = [n for n in picks if "priority >= 0" in n.get("Index Cond", "")]
            assert zero and all("workqueue_id >" in n["Index Cond"] for n in zero), picks
            others = [n for n in picks if n not in zero]
            bands = ("priority > 0", "priority < 0")
            assert all(any(b in n.get("Index Cond", "") for b in bands) for n in others), picks


def test_claim_plan_does_not_depend_on_fresh_statistics(conn: psycopg.Connection) -> None:
    """A bulk enqueue into a table whose statistics say 'empty' still claims cheaply.

    claim v2 re-checked `status = 'pending'` in the UPDATE, which matches the
    partial index's predicate: with stale statistics the planner scanned the
    whole pending index, dead entries of claimed rows included, filtering by
    the id array (~5,000 buffers, ~14 ms for 20,000 pending rows). v3 must
    find the rows by primary key.
    """
    conn.execute("INSERT INTO pepsi.workqueue (stage) SELECT 's0' FROM generate_series(1, 20000)")
    conn.execute(
        "INSERT INTO pepsi.workqueue (stage, status) SELECT 's1', 'done'"
        " FROM generate_series(1, 20000)"
    )
    for _ in range(3):  # claimed rows leave dead entries in the pending index
        conn.execute("SELECT * FROM pepsi.claim(1, %s, %s)", (STAGES, [64] * 8)).fetchall()
    plans = claim_plans(conn, CAPS16)
    assert_index_plan(plans)
    pending_idx_scans = [s for s in scans(plans) if s[2] == "workqueue_pending_idx"]
    # v5: the pick's three priority bands; the UPDATE itself goes by primary key.
    assert len(pending_idx_scans) == 3, f"only the pick may walk the pending index: {scans(plans)}"
    buffers = plans[0]["Plan"]["Shared Hit Blocks"] + plans[0]["Plan"].get("Shared Read Blocks", 0)
    assert buffers < 1000, f"claim of 16 rows touched {buffers} buffers: {scans(plans)}"


def transition_plans(conn: psycopg.Connection, calls: list[str]) -> list[dict]:
    """Plans of the UPDATE statements run inside the given calls (rolled back),
    bare or in a WITH (check_answered v3 wraps its UPDATE in a CTE)."""
    plans = captured_plans(conn, [(call, ()) for call in calls])
    return [p for p in plans if _is_update(p.get("Query Text", ""))]


def _is_update(text: str) -> bool:
    text = text.lstrip()
    return text.startswith("UPDATE") or (
        text.startswith("WITH") and "UPDATE pepsi.workqueue" in text
    )


def test_transitions_find_the_row_by_primary_key(conn: psycopg.Connection) -> None:
    """Stage transitions look the row up by workqueue_pkey, whatever the statistics say.

    v1 re-checked `status = 'running'`, which proves the running index's
    predicate: statistics taken while nothing ran made every transition walk
    the whole running index (up to 8 ms a call with thousands running).
    """
    conn.execute("INSERT INTO pepsi.workqueue (stage) SELECT 's0' FROM generate_series(1, 20000)")
    conn.execute("ANALYZE pepsi.workqueue")  # nothing running yet
    ids = [r[0] for r in conn.execute("SELECT * FROM pepsi.claim(1, %s, %s)", (["s0"], [3000]))]
    calls = [f"SELECT pepsi.finish({i}, 's0', 1)" for i in ids[:4]]
    calls += [f"SELECT pepsi.advance({i}, 's0', 's1', 1)" for i in ids[4:8]]
    calls += [f"SELECT pepsi.fail({i}, 's0', 'x', 1)" for i in ids[8:12]]
    calls += [f"SELECT pepsi.pause({i}, 's0', now() + interval '1 h', 'x', 1)" for i in ids[12:16]]
    calls += [f"SELECT pepsi.hop({i}, 's0', 's1', 1)" for i in ids[16:20]]
    calls.append(f"SELECT * FROM pepsi.check_answered(1, ARRAY{ids[20:40]}::bigint[])")
    plans = transition_plans(conn, calls)
    assert len(plans) >= len(calls)
    used = {(n["Node Type"], n.get("Index Name")) for p in plans for n in _nodes(p["Plan"])}
    assert ("Seq Scan", None) not in used, used
    assert not [u for u in used if u[1] == "workqueue_running_idx"], f"running index walked: {used}"


def test_the_dispatchers_reads_use_an_index(big_dsn: str) -> None:
    """held_ids walks workqueue_running_idx and stages_of looks rows up by primary
    key (0014: what the dispatcher selected from the tables). dispatcher_registered reads
    the registry, a handful of rows: its plan is captured but any scan is fine."""
    with psycopg.connect(big_dsn, autocommit=True) as conn:
        with conn.transaction(force_rollback=True):
            ids = [
                r[0] for r in conn.execute("SELECT * FROM pepsi.claim(7, %s, %s)", (STAGES, CAPS16))
            ]
            conn.execute("SELECT * FROM pepsi.claim(8, %s, %s)", (STAGES, CAPS16)).fetchall()
            calls = [
                ("SELECT * FROM pepsi.held_ids(7)", ()),
                ("SELECT * FROM pepsi.stages_of(%s::bigint[])", (ids[:20],)),
                ("SELECT pepsi.dispatcher_registered(7)", ()),
            ]
            plans = captured_plans(conn, calls)
            assert len(set(ids)) == 128
        conn.execute("VACUUM ANALYZE pepsi.workqueue")
    inner = [p for p in plans if "pepsi.workqueue AS w" in p.get("Query Text", "")]
    inner += [p for p in plans if "pepsi.dispatchers AS d" in p.get("Query Text", "")]
    assert len(inner) == 3, [p.get("Query Text") for p in plans]
    found = scans(inner[:2])
    assert not [s for s in found if s[0] == "Seq Scan"], f"sequential scan: {found}"
    assert {s[2] for s in found} == {"workqueue_running_idx", "workqueue_pkey"}, found


def _band_scans(plans: list[dict]) -> list[dict]:
    """The scan nodes of the pick (the UPDATE's own scan by primary key left out)."""
    nodes = _nodes(plans[0]["Plan"])
    pick = next(n for n in nodes if n.get("Subplan Name", "").startswith("InitPlan"))
    return [n for n in _nodes(pick) if n.get("Relation Name") == "workqueue"]


def _one_stage_behind(conn: psycopg.Connection) -> None:
    """A 3-stage pipeline whose first stage holds the backlog, analysed as it is."""
    conn.execute("INSERT INTO pepsi.workqueue (stage) SELECT 'a' FROM generate_series(1, 100000)")
    conn.execute(
        "INSERT INTO pepsi.workqueue (stage) SELECT (ARRAY['b', 'c'])[1 + i % 2]"
        " FROM generate_series(1, 40) AS i"
    )
    conn.execute("ANALYZE pepsi.workqueue")


def _behind_call(skip_locked: bool = False, floor_a: int | None = None) -> tuple[str, tuple]:
    """A claim of 4 rows for each of stages a, b and c (``floor_a``: stage a's floor)."""
    return (
        "SELECT * FROM pepsi.claim(1, %s, %s, %s, %s::bigint[])",
        (["a", "b", "c"], [4, 4, 4], skip_locked, [floor_a, None, None]),
    )


def test_a_backlog_in_one_stage_leaves_the_pick_on_the_pending_index(dsn: str) -> None:
    """Statistics taken while stage a holds 100,000 pending rows and b, c 20 each:
    every band of every stage walks workqueue_pending_idx (v7's priority-0 band
    walked the primary key here, filtering on stage), and no call is compiled
    by JIT (the plan carries the cost of the disabled sort)."""
    with psycopg.connect(dsn, autocommit=True) as setup:
        _one_stage_behind(setup)
    for skip_locked in (False, True):
        with psycopg.connect(dsn, autocommit=True) as conn:  # planned now, on these statistics
            plans = captured_plans(conn, [_behind_call(skip_locked)])
            assert not [p for p in plans if "JIT" in p], "a claim was compiled by JIT"
            update = [p for p in plans if "UPDATE pepsi.workqueue" in p.get("Query Text", "")]
            assert_index_plan(update)
            bands = _band_scans(update)
            assert {n.get("Index Name") for n in bands} == {"workqueue_pending_idx"}, bands
            assert pick_buffers(update) < 100
            moved = next(n for n in _nodes(update[0]["Plan"]) if n["Node Type"] == "ModifyTable")
            assert moved["Actual Rows"] == 12


def test_the_floor_still_starts_the_priority_0_band(dsn: str) -> None:
    """The range form of the band is positioned on the floor: after 20,000 claimed
    rows (dead entries at the band's low end) a claim with the floor reads a
    few pages of the index, one without it reads past the dead entries."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        _one_stage_behind(conn)
        ids = [r[0] for r in conn.execute("SELECT * FROM pepsi.claim(5, '{a}', '{20000}')")]
        buffers = {}
        for floor in (None, max(ids)):
            plans = captured_plans(conn, [_behind_call(floor_a=floor)])
            update = [p for p in plans if "UPDATE" in p["Query Text"]]
            buffers[floor] = sum(
                n["Shared Hit Blocks"] + n["Shared Read Blocks"]
                for n in _band_scans(update)
                if "priority >= 0" in n.get("Index Cond", "")
            )
    assert buffers[max(ids)] < 30, buffers
    assert buffers[None] > 5 * buffers[max(ids)], buffers


def test_claim_v7_walked_the_primary_key_here(dsn: str) -> None:
    """The check above can fail: with 0024's claim v7 the same session's
    priority-0 band is a primary key walk that filters out the backlog."""
    alembic(dsn, "downgrade", "0024")
    with psycopg.connect(dsn, autocommit=True) as setup:
        _one_stage_behind(setup)
    with psycopg.connect(dsn, autocommit=True) as conn:
        plans = captured_plans(conn, [_behind_call()])
        update = [p for p in plans if "UPDATE" in p["Query Text"]]
    walks = [n for n in _band_scans(update) if n.get("Index Name") == "workqueue_pkey"]
    assert walks, _band_scans(update)
    assert sum(n.get("Rows Removed by Filter", 0) for n in walks) > 50_000
