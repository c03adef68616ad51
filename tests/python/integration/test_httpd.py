"""pepsi-httpd: /metrics scraped for real and parsed by prometheus_client's parser, /healthz."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from dispatch_harness import Harness, harness_fixture, wait_until  # noqa: F401
from httpd_harness import Httpd
from prometheus_client.parser import text_string_to_metric_families
from psycopg.conninfo import make_conninfo

from pepsi_dispatch.coordinator.database.postgres import LOCK_KEY


@pytest.fixture
def httpds() -> Iterator[list[Httpd]]:
    started: list[Httpd] = []
    yield started
    for s in started:
        s.stop()


def scrape(srv: Httpd) -> dict[str, dict[tuple, float]]:
    """family name -> {sorted label items + sample name: value}, parsed like Prometheus does."""
    status, ctype, body = srv.get("/metrics")
    assert status == 200, body
    assert ctype.startswith("text/plain; version=0.0.4"), ctype
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(body):
        samples = out.setdefault(fam.name, {})
        for s in fam.samples:
            samples[(s.name, *sorted(s.labels.items()))] = s.value
    return out


def conf_fast(h: Harness) -> Path:
    # POLL_INTERVAL 1 s: heartbeats (and so gauges) every second.
    stages = h.pipeline(["a", "b"], PARALLELISM=2)
    return h.conf(stages, poll_interval="1 s", stats_interval="1 s")


def test_metrics_real_scrape_matches_database(h: Harness, httpds: list[Httpd]) -> None:
    conf = conf_fast(h)
    d = h.start(conf)
    ok = h.enqueue("a", 20)
    bad = h.enqueue("a", [{"do_a": "sqlfail"}] * 3)
    h.wait_all(where=f"workqueue_id <= {max(ok + bad)}")
    # Rows no dispatcher stage takes: they stay pending and age.
    h.conn.execute(
        "INSERT INTO pepsi.workqueue (stage, updated_at) VALUES ('z', now() - interval '42 s')"
    )
    srv = Httpd(conf, h.dsn, h.tmp / "httpd.log")
    httpds.append(srv)

    def settled():
        m = scrape(srv)
        stats = h.stage_stats()
        processed = m.get("pepsi_stage_processed", {})
        service = m.get("pepsi_dispatcher_service_seconds", {})
        count_a, count_b = (
            sum(v for k, v in service.items() if k[0].endswith("_count") and ("stage", s) in k)
            for s in ("a", "b")
        )
        # (the histograms ride on the heartbeat's gauges, which may come after
        # the stats flush: wait for both stages' counts)
        if (
            stats.get("b", {}).get("processed") == 20
            and processed.get(("pepsi_stage_processed_total", ("stage", "b"))) == 20
            and count_a >= 23
            and count_b >= 20
        ):
            return m
        return None

    m = wait_until(settled, 30, 0.2, lambda: "stats flushed and gauges heartbeat\n" + d.tail())
    did = socket.gethostname()  # the label: the host, stable across restarts

    # Stats and queue depth equal the database.
    for stage, row in h.stage_stats().items():
        for col in ("processed", "failed", "timeouts", "crashes"):
            assert (
                m[f"pepsi_stage_{col}"][(f"pepsi_stage_{col}_total", ("stage", stage))] == row[col]
            )
    depth = m["pepsi_queue_depth"]
    for stage, status, n in h.conn.execute(
        "SELECT stage, status, count(*) FROM pepsi.messages GROUP BY 1, 2"
    ).fetchall():
        assert depth[("pepsi_queue_depth", ("stage", stage), ("status", status))] == n
    assert (
        m["pepsi_queue_messages"][("pepsi_queue_messages_total",)] == h.dispatch_stats()["messages"]
    )

    # New series: oldest pending age, retries due, live dispatchers, gauges.
    since = m["pepsi_queue_oldest_pending_timestamp_seconds"][
        ("pepsi_queue_oldest_pending_timestamp_seconds", ("stage", "z"))
    ]
    assert 42 <= time.time() - since < 120  # a timestamp, not an age
    [(key, beat)] = m["pepsi_dispatcher_last_heartbeat_timestamp_seconds"].items()
    assert key[1] == ("dispatcher", socket.gethostname()), "labelled by host, stable"
    assert 0 <= time.time() - beat < 120
    assert "pepsi_queue_retries_due" in m
    assert m["pepsi_dispatchers_live"][("pepsi_dispatchers_live",)] == 1
    assert m["pepsi_stage_paused"][("pepsi_stage_paused", ("stage", "a"))] == 0
    workers = m["pepsi_dispatcher_workers"]
    assert {k[2][1] for k in workers} == {"a", "b"}  # ("stage", name)
    assert (
        m["pepsi_dispatcher_round_trips"][
            ("pepsi_dispatcher_round_trips_total", ("dispatcher", did))
        ]
        > 0
    )
    assert m["pepsi_dispatcher_claims"][("pepsi_dispatcher_claims_total", ("dispatcher", did))] > 0
    db = m["pepsi_dispatcher_db_round_trip_seconds"]
    inf = db[("pepsi_dispatcher_db_round_trip_seconds_bucket", ("dispatcher", did), ("le", "+Inf"))]
    assert inf == db[("pepsi_dispatcher_db_round_trip_seconds_count", ("dispatcher", did))] > 0
    service = m["pepsi_dispatcher_service_seconds"]
    # 20 ok + 3 sqlfail (answer 0 after pepsi.fail) at a, 20 at b.
    key_b = ("pepsi_dispatcher_service_seconds_count", ("dispatcher", did), ("stage", "b"))
    assert service[key_b] == 20
    assert "pepsi_dispatcher_inflight_ids" in m and "pepsi_dispatcher_inflight" in m
    assert m["pepsi_database_up"][("pepsi_database_up",)] == 1


def test_metrics_sql_part_is_cached_for_a_second(h: Harness, httpds: list[Httpd]) -> None:
    srv = Httpd(None, h.dsn, h.tmp / "httpd.log")
    httpds.append(srv)
    scrape(srv)
    calls = "SELECT calls FROM pg_stat_user_functions WHERE funcname = 'dashboard_snapshot'"
    dbname = h.conn.info.dbname
    h.conn.execute(f"ALTER DATABASE \"{dbname}\" SET track_functions = 'pl'")
    srv.stop()
    srv = Httpd(None, h.dsn, h.tmp / "httpd2.log")
    httpds.append(srv)
    t0 = time.monotonic()
    for _ in range(20):
        scrape(srv)
    elapsed = time.monotonic() - t0
    srv.stop()  # its backend flushes its function statistics as it exits

    def counted():
        h.conn.execute("SELECT pg_stat_clear_snapshot()")
        row = h.conn.execute(calls).fetchone()
        return row and row[0]

    # At most one snapshot query per second (plus the 5 s sampler's), not one per scrape.
    n = wait_until(counted, 30, 0.1, "pg_stat_user_functions to count the calls")
    assert n <= int(elapsed) + 3 < 20, (n, elapsed)


def test_healthz(h: Harness, httpds: list[Httpd]) -> None:
    conf = conf_fast(h)
    srv = Httpd(conf, h.dsn, h.tmp / "httpd.log")
    httpds.append(srv)
    status, _, body = srv.get("/healthz")
    assert status == 503 and body.startswith("no live dispatcher"), body
    d = h.start(conf)
    wait_until(lambda: srv.get("/healthz")[0] == 200, 10, 0.1, "healthz 200 with a dispatcher")
    assert srv.get("/healthz")[2].startswith("ok: 1 live dispatcher")
    assert d.terminate() == 0  # a clean stop unregisters
    wait_until(lambda: srv.get("/healthz")[0] == 503, 10, 0.1, "healthz 503 after the stop")
    # A dead dispatcher's row that stays behind, fresh heartbeat and all: its session
    # is gone, so it is not live.
    h.conn.execute(
        "INSERT INTO pepsi.dispatchers (hostname, pid, heartbeat_at, gauges)"
        " VALUES ('gone', 1, now(), '{\"heartbeat_interval\": 1}')"
    )
    time.sleep(1.1)  # the snapshot cache
    assert srv.get("/healthz")[2].startswith("no live dispatcher")
    # A registration whose session is there (this test's connection), but no session
    # holding the dispatcher lock: still 503.
    did = h.conn.execute("SELECT pepsi.register_dispatcher('here', 1, true)").fetchone()[0]
    wait_until(
        lambda: srv.get("/healthz")[2].startswith("no dispatcher session"),
        5,
        0.1,
        "a registration without the dispatcher lock is not serving",
    )
    h.conn.execute("SELECT pg_advisory_lock_shared(%s)", (LOCK_KEY,))  # as a replica does
    try:
        wait_until(lambda: srv.get("/healthz")[0] == 200, 5, 0.1, "registered and locked: live")
    finally:
        h.conn.execute("SELECT pg_advisory_unlock_shared(%s)", (LOCK_KEY,))
        h.conn.execute("SELECT pepsi.unregister_dispatcher(%s)", (did,))


def test_a_dispatcher_killed_with_sigkill_is_neither_exported_nor_counted(
    h: Harness, httpds: list[Httpd]
) -> None:
    """SIGKILL leaves a fresh heartbeat and the last gauges behind (they stayed exported,
    as a live or 'stale' dispatcher with busy workers, for minutes and restarts); the
    dispatcher's sessions go at once, and with them its liveness: /healthz turns 503,
    /metrics drops it, a new dispatcher removes its registration."""
    conf = conf_fast(h)
    srv = Httpd(conf, h.dsn, h.tmp / "httpd.log")
    httpds.append(srv)
    d = h.start(conf)
    wait_until(lambda: srv.get("/healthz")[0] == 200, 10, 0.1, "healthz 200 with a dispatcher")
    # Start-up registers the dispatcher, then its stages: queue_overview has rows
    # only once both committed (a SIGKILL between the two leaves no stage row).
    stages = "SELECT count(*) FROM pepsi.queue_overview()"
    wait_until(lambda: h.conn.execute(stages).fetchone()[0] > 0, 10, 0.05, "stages registered")
    m = scrape(srv)
    assert m["pepsi_dispatcher_session"][("pepsi_dispatcher_session",)] == 1
    d.kill9()
    t0 = time.monotonic()
    wait_until(lambda: srv.get("/healthz")[0] == 503, 5, 0.1, "healthz 503 after SIGKILL")
    took = time.monotonic() - t0
    status, _, body = srv.get("/healthz")
    assert status == 503 and body.startswith("no live dispatcher"), body
    assert took < 5, took  # the heartbeat alone would have kept it 200 for >= 10 s
    m = scrape(srv)
    assert m["pepsi_dispatcher_session"][("pepsi_dispatcher_session",)] == 0
    assert "pepsi_dispatchers" not in m, "one gauge for one meaning: pepsi_dispatchers_live"
    assert m["pepsi_dispatchers_live"][("pepsi_dispatchers_live",)] == 0
    assert not m.get("pepsi_dispatcher_workers"), m.get("pepsi_dispatcher_workers")
    overview = h.conn.execute("SELECT sum(dispatchers), sum(workers) FROM pepsi.queue_overview()")
    assert overview.fetchone() == (0, 0)
    assert h.conn.execute("SELECT bool_or(live) FROM pepsi.queue_dispatchers()").fetchone() == (
        False,
    )
    # A new dispatcher: only it is registered (the dead one's row is removed at start).
    # It registers first, then removes the others (wait_ready returns in between).
    d2 = h.start(conf)
    registered = "SELECT array_agg(dispatcher_id) FROM pepsi.dispatchers"
    wait_until(
        lambda: h.conn.execute(registered).fetchone() == ([d2.dispatcher_id(h.conn)],),
        10,
        0.05,
        lambda: f"only the new dispatcher registered: {h.conn.execute(registered).fetchone()}",
    )
    wait_until(lambda: srv.get("/healthz")[0] == 200, 10, 0.1, "healthz 200 again")
    m = scrape(srv)
    assert m["pepsi_dispatchers_live"][("pepsi_dispatchers_live",)] == 1


def test_healthz_and_metrics_without_database(tmp_path: Path, httpds: list[Httpd]) -> None:
    srv = Httpd(None, "host=127.0.0.1 port=1 dbname=none connect_timeout=2", tmp_path / "h.log")
    httpds.append(srv)
    status, _, body = srv.get("/healthz")
    assert status == 503 and body.startswith("database unavailable"), body
    status, _, body = srv.get("/metrics")
    assert status == 200
    fams = {f.name: f for f in text_string_to_metric_families(body)}
    assert fams["pepsi_database_up"].samples[0].value == 0


def test_read_only_refuses_actions(h: Harness, httpds: list[Httpd]) -> None:
    [wid] = h.enqueue("nowhere", 1)
    srv = Httpd(None, h.dsn, h.tmp / "httpd.log")
    httpds.append(srv)
    status, body = srv.post("/api/cancel", {"ids": [wid]})
    assert status == 403 and "--allow-actions" in body["error"]
    assert h.row(wid)["status"] == "pending"
    status, _, page = srv.get("/")
    assert status == 200 and 'data-allow-actions="false"' in page


def test_actions_need_json_and_header(h: Harness, httpds: list[Httpd]) -> None:
    [wid] = h.enqueue("nowhere", 1)
    srv = Httpd(None, h.dsn, h.tmp / "httpd.log", allow_actions=True)
    httpds.append(srv)
    status, _ = srv.post("/api/cancel", {"ids": [wid]}, {"X-Pepsi-Action": "0"})
    assert status == 400
    status, body = srv.post("/api/cancel", {"ids": [wid]})
    assert (status, body) == (200, {"rows": 1})
    assert h.row(wid)["status"] == "failed"
    assert h.row(wid)["state"]["error"] == "cancelled by operator"


def test_paused_overlay_option_empties_capacity(h: Harness) -> None:
    from pepsi_dispatch.config import apply_overlay, load_config
    from pepsi_dispatch.coordinator.workers.stage_pool import StagePool

    config = load_config(conf_fast(h))
    assert not config.stages["a"].paused
    paused = apply_overlay(config, [("stage-a", "PAUSED", "yes")])
    assert paused.stages["a"].paused and not paused.stages["b"].paused
    assert StagePool(paused.stages["a"], 1).capacity(0.0) == 0
    assert StagePool(paused.stages["b"], 1).capacity(0.0) == 2 * 4


def test_bench_scrape_option(dsn: str) -> None:
    """`make bench BENCH_ARGS='--scrape 1'` runs (here tiny): both drains, the scrape times."""
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pepsi_dispatch.devtools.bench",
            "--scrape",
            "0.2",
            "--messages",
            "300",
            "--stages",
            "1",
            "--worker",
            "raw",
            "--latency",
            "0",
        ],
        env={**os.environ, "PEPSI_DSN": dsn},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "raw     alone" in out.stdout and "raw     scraped" in out.stdout, out.stdout
    assert "GET /metrics during the drain" in out.stdout, out.stdout


def test_ids_beyond_bigint_are_answered_not_dropped(h: Harness, httpds: list[Httpd]) -> None:
    # An id past bigint made the handler raise (psycopg sent it as numeric): the
    # client got no HTTP answer at all, only a closed connection.
    [wid] = h.enqueue("nowhere", 1)
    srv = Httpd(None, h.dsn, h.tmp / "httpd.log", allow_actions=True)
    httpds.append(srv)
    huge = 2**63
    status, _, body = srv.get(f"/api/message/{huge}")
    assert status == 404 and f"no message {huge}" in body, body
    status, body = srv.post("/api/cancel", {"ids": [wid, huge]})
    assert status == 400 and "integers" in body["error"], body
    status, body = srv.post("/api/requeue", [wid])
    assert status == 400 and body["error"] == "bad request: the body must be a JSON object", body
    assert h.row(wid)["status"] == "pending"
    assert srv.get(f"/api/message/{wid}")[0] == 200


@pytest.fixture
def outsider(pg_admin_dsn: str) -> Iterator[str]:
    """A login role in no pepsi role (cluster-wide: dropped afterwards)."""
    name = f"pepsi_x_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'x'")
    yield name
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
        )
        admin.execute(f"DROP ROLE IF EXISTS {name}")


def test_a_role_without_pepsi_dashboard_gets_answers(
    h: Harness, httpds: list[Httpd], outsider: str
) -> None:
    # Permission denied was no DatabaseDown: the request thread died and the
    # client got a closed connection instead of a status (and no hint).
    srv = Httpd(None, make_conninfo(h.dsn, user=outsider, password="x"), h.tmp / "httpd.log")
    httpds.append(srv)
    status, _, body = srv.get("/healthz")
    assert status == 503, body
    assert "permission denied" in body and f"GRANT pepsi_dashboard TO {outsider}" in body, body
    status, _, body = srv.get("/metrics")
    assert status == 200 and "pepsi_database_up 0.0" in body, body
    status, _, body = srv.get("/api/overview")
    assert status == 503 and "GRANT pepsi_dashboard" in body, body
    assert srv.proc.poll() is None


def test_the_pause_button_of_a_dropped_stage_cannot_stop_the_dispatcher(
    h: Harness, httpds: list[Httpd]
) -> None:
    """A pepsi-httpd whose configuration still lists a stage the dispatcher has dropped
    offered its Pause button; the PAUSED row it wrote was a section without a PROGRAM,
    the dispatcher's reload did not parse and it exited 1 (and every restart 2)."""
    served = h.pipeline(["a", "b"])
    conf = h.conf(served, poll_interval="1 s")
    stale = h.conf({**served, "old": dict(served["b"])}, name="httpd.conf")
    d = h.start(conf)
    srv = Httpd(stale, h.dsn, h.tmp / "httpd.log", allow_actions=True)
    httpds.append(srv)
    status, body = srv.post("/api/pause", {"stage": "old", "paused": True})
    assert status == 400 and "unknown stage old" in body["error"], body
    assert h.conn.execute("SELECT count(*) FROM pepsi.config").fetchone() == (0,)
    # The dispatcher serves on; a stage it serves can still be paused and resumed.
    status, body = srv.post("/api/pause", {"stage": "a", "paused": True})
    assert (status, body) == (200, {"changed": True})
    status, body = srv.post("/api/pause", {"stage": "a", "paused": False})
    assert (status, body) == (200, {"changed": True})
    ids = h.enqueue("a", 3)
    h.wait_all(where=f"workqueue_id <= {max(ids)}")
    assert all(h.row(i)["status"] == "done" for i in ids)
    assert d.running(), d.tail()


def test_zero_series_and_the_graph_from_the_registry_alone(h: Harness, httpds: list[Httpd]) -> None:
    d = h.start(conf_fast(h))
    h.enqueue("a", 3)
    h.wait_all()
    # No configuration file: only a DSN (the graph comes from the stage registry).
    srv = Httpd(None, h.dsn, h.tmp / "httpd.log")
    httpds.append(srv)
    m = scrape(srv)
    statuses = ("pending", "running", "paused", "done", "failed", "timeout", "expired")
    for stage in ("a", "b"):
        for status in statuses:
            key = (("stage", stage), ("status", status))
            assert ("pepsi_queue_depth", *key) in m["pepsi_queue_depth"], key
            age = ("pepsi_queue_oldest_age_seconds", *key)
            assert age in m["pepsi_queue_oldest_age_seconds"], key
    assert m["pepsi_queue_depth"][("pepsi_queue_depth", ("stage", "a"), ("status", "failed"))] == 0
    assert m["pepsi_queue_depth"][("pepsi_queue_depth", ("stage", "b"), ("status", "done"))] == 3
    oldest = m["pepsi_queue_oldest_timestamp_seconds"]
    assert ("pepsi_queue_oldest_timestamp_seconds", ("stage", "b"), ("status", "done")) in oldest
    assert not any(k[1] == ("stage", "a") for k in oldest), "no row of a: no timestamp"
    ages = m["pepsi_queue_oldest_age_seconds"]
    assert ages[("pepsi_queue_oldest_age_seconds", ("stage", "a"), ("status", "failed"))] == 0
    done_age = ages[("pepsi_queue_oldest_age_seconds", ("stage", "b"), ("status", "done"))]
    assert 0 < done_age < 120, done_age
    status, _, body = srv.get("/api/overview")
    assert status == 200, body
    stages = json.loads(body)["stages"]
    assert stages["a"]["next"] == ["b"] and stages["b"]["next"] == []
    assert stages["a"]["registered"] and stages["a"]["health"]["state"] == "serving"
    d.terminate()


def test_unmigrated_database_gets_the_migrate_hint(
    empty_dsn: str, tmp_path: Path, httpds: list[Httpd]
) -> None:
    srv = Httpd(None, empty_dsn, tmp_path / "httpd.log")
    httpds.append(srv)
    hint = "run `pepsi-queue migrate`"
    assert hint in srv.log() and "at start" in srv.log(), srv.log()  # said at start
    status, _, body = srv.get("/healthz")
    assert status == 503 and hint in body and "database unavailable" not in body, body
    status, _, body = srv.get("/api/overview")
    assert status == 503 and hint in body, body


def test_a_dsn_that_does_not_parse_ends_pepsi_httpd_at_start(tmp_path: Path) -> None:
    from httpd_harness import HTTPD

    r = subprocess.run(
        [str(HTTPD), "--listen", "127.0.0.1:0"],
        env={**os.environ, "PEPSI_DSN": "password=s3cret not-a-dsn"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 2, r
    assert "DSN" in r.stderr and "does not parse" in r.stderr, r.stderr
    assert "s3cret" not in r.stderr + r.stdout


def test_a_bad_listen_is_one_usage_line_before_the_database_is_tried(tmp_path: Path) -> None:
    from httpd_harness import HTTPD

    r = subprocess.run(
        [str(HTTPD), "--listen", "bad"],
        env={**os.environ, "PEPSI_DSN": "postgresql://nobody@127.0.0.1:1/none"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 2, r
    assert "--listen 'bad': expected HOST:PORT" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
