"""The Prometheus families have one list and one meaning.

``pepsi_dispatch/httpd/exposition.py`` writes every family and its help text.
The one SQL function that renders Prometheus text is the contract's
``pepsi.metrics()``, and its help texts are exposition.py's (here, from the
file; the samples are compared against a database in
tests/python/integration/test_metrics_sql_parity.py). The table of
docs/OPERATIONS.md ("/metrics (Grafana-ready list)") names exactly the families
the renderer writes, with their types and labels. No database.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from pepsi_dispatch.httpd import exposition

ROOT = Path(__file__).resolve().parents[3]
Family = tuple[str, str, tuple[str, ...]]  # (name as documented, type, labels)


def prometheus_in_sql(functions: Path) -> list[str]:
    """The function files that write Prometheus HELP or TYPE lines."""
    pattern = re.compile(r"#\s*(HELP|TYPE)\s+pepsi_")
    return sorted(p.name for p in functions.glob("*.sql") if pattern.search(p.read_text()))


def _histogram(sum_: float = 0.05) -> dict[str, Any]:
    return {"bounds": [0.1], "counts": [1, 0], "sum": sum_}


def full_snapshot() -> dict[str, Any]:
    """A dashboard_snapshot() in which every family has a sample."""
    stage = {"stage": "a"} | {col: 1 for col, _ in exposition.STAGE_COUNTERS}
    gauges = {
        "workers": {"a": {"busy": 1}},
        "inflight": {"a": 1},
        "inflight_ids": 1,
        "round_trips": 2,
        "claims": 1,
        "db_round_trip_seconds": _histogram(),
        "service_seconds": {"a": _histogram()},
    }
    return {
        "stage_stats": [stage],
        "totals": {name: 1 for name, _ in exposition.GLOBAL_COUNTERS},
        "queue": [{"stage": "a", "status": "pending", "count": 1, "oldest_age": 2.0}],
        "oldest_pending": {"a": 2.0},
        "retries_due": {"a": 0},
        "stage_health": [{"stage": "a", "state": "held_off", "held_seconds": 3.0}],
        "dispatchers": [
            {"dispatcher_id": 1, "hostname": "h", "pid": 7, "heartbeat_age": 1.0, "live": True}
            | {"gauges": gauges}
        ],
        "dispatcher_session": True,
    }


def rendered(snap: dict[str, Any]) -> set[Family]:
    """(documented name, type, labels) of every family /metrics writes for ``snap``."""
    text = exposition.render(exposition.families(snap, {"a": False}, 0.01)).decode()
    out = set()
    for fam in text_string_to_metric_families(text):
        labels = {k for s in fam.samples for k in s.labels if k != "le"}
        name = f"{fam.name}_total" if fam.type == "counter" else fam.name
        out.add((name, fam.type, tuple(sorted(labels))))
    return out


def documented(markdown: str) -> set[Family]:
    """(name, type, labels) of each row of the /metrics table of docs/OPERATIONS.md."""
    start = markdown.index("| metric | type | labels |")
    out = set()
    for line in markdown[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        names, kind, labels = (c.strip() for c in line.strip("|").split("|")[:3])
        label_set = tuple(sorted(x.strip() for x in labels.split(",") if x.strip()))
        for name in re.findall(r"`(pepsi_[a-z_]+)`", names):
            out.add((name, kind, label_set))
    return out


def test_only_the_contracts_metrics_renders_prometheus_text_in_sql() -> None:
    assert prometheus_in_sql(ROOT / "sql" / "functions") == ["metrics.sql"]


def sql_help_texts(text: str) -> list[tuple[str, str]]:
    """(column, help text) of the ``(N, 'column', 'help')`` rows of metrics.sql, in order."""
    return re.findall(r"\(\d+, '([a-z_]+)', '([^']*)'\)", text)


def test_the_sql_help_texts_are_exposition_s() -> None:
    got = sql_help_texts((ROOT / "sql" / "functions" / "metrics.sql").read_text())
    assert got == [*exposition.STAGE_COUNTERS, *exposition.GLOBAL_COUNTERS]


def test_the_help_text_check_sees_a_difference() -> None:
    text = "(1, 'processed', 'Messages a stage processed.')"
    assert sql_help_texts(text) == [("processed", "Messages a stage processed.")]
    assert sql_help_texts(text) != list(exposition.STAGE_COUNTERS[:1])


def test_the_sql_check_sees_a_renderer(tmp_path: Path) -> None:
    (tmp_path / "metrics.sql").write_text("SELECT E'# HELP pepsi_queue_depth Rows.\\n'")
    (tmp_path / "other.sql").write_text("-- # not a metric\nSELECT 1")
    assert prometheus_in_sql(tmp_path) == ["metrics.sql"]


def test_the_operations_table_is_what_metrics_renders() -> None:
    doc = documented((ROOT / "docs" / "OPERATIONS.md").read_text(encoding="utf-8"))
    got = rendered(full_snapshot())
    assert sorted(got - doc) == [], "rendered but not in docs/OPERATIONS.md's /metrics table"
    assert sorted(doc - got) == [], "in docs/OPERATIONS.md's /metrics table but not rendered"


def test_the_docs_check_sees_a_wrong_type_and_a_missing_family() -> None:
    doc = documented(
        "| metric | type | labels | meaning |\n|---|---|---|---|\n"
        "| `pepsi_queue_depth` | counter | stage, status | x |\n"
        "| `pepsi_database_up` | gauge | | x |\n\nafter"
    )
    assert doc == {
        ("pepsi_queue_depth", "counter", ("stage", "status")),
        ("pepsi_database_up", "gauge", ()),
    }
    got = rendered(full_snapshot())
    assert ("pepsi_queue_depth", "gauge", ("stage", "status")) in got - doc
    assert ("pepsi_stage_paused", "gauge", ("stage",)) in got - doc


def test_dispatcher_labels_are_unique_in_a_scrape() -> None:
    """Host name alone; host:pid on a shared host; host:pid:id when both are
    shared (registrations a heartbeat re-created after a replica declared them
    dead carry a placeholder host and pid 0): never two series with one label."""
    placeholder = {"hostname": "re-registered by heartbeat", "pid": 0}
    dispatchers = [
        {"dispatcher_id": 1, "hostname": "a", "pid": 10},
        {"dispatcher_id": 2, "hostname": "b", "pid": 11},
        {"dispatcher_id": 3, "hostname": "b", "pid": 12},
        {"dispatcher_id": 4, **placeholder},
        {"dispatcher_id": 5, **placeholder},
    ]
    labels = exposition.dispatcher_labels(dispatchers)
    assert labels == {
        1: "a",
        2: "b:11",
        3: "b:12",
        4: "re-registered by heartbeat:0:4",
        5: "re-registered by heartbeat:0:5",
    }
    assert len(set(labels.values())) == len(dispatchers)
