"""``pepsi.metrics()`` (the contract's SQL exposition for any HTTP front end) and
pepsi-httpd's ``/metrics`` say the same thing: from one database state, every
family the SQL renders is in pepsi-httpd's exposition with the same type, help
text and samples. Also: it is valid Prometheus text, it runs under the roles it
is granted to, and not under a stage's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg.conninfo import make_conninfo

from pepsi_dispatch.httpd import exposition


def parsed(text: str) -> dict[str, tuple[str, str, dict[tuple, float]]]:
    """family name -> (type, help, {(sample name, labels...): value})."""
    out = {}
    for fam in text_string_to_metric_families(text):
        samples = {(s.name, *sorted(s.labels.items())): s.value for s in fam.samples}
        out[fam.name] = (fam.type, fam.documentation, samples)
    return out


@pytest.fixture
def busy(conn: psycopg.Connection) -> psycopg.Connection:
    """A queue with rows in several statuses, a registered stage with none, stats and
    totals that are not zero."""
    conn.execute("INSERT INTO pepsi.stages (stage) VALUES ('fetch'), ('parse.v2'), ('idle')")
    conn.execute(
        "INSERT INTO pepsi.workqueue (stage, status, dispatcher_id, timeout) VALUES"
        " ('fetch', 'pending', NULL, NULL), ('fetch', 'pending', NULL, NULL),"
        " ('fetch', 'running', 1, NULL), ('parse.v2', 'paused', NULL, now() - interval '1 s'),"
        " ('parse.v2', 'paused', NULL, now() + interval '1 h'),"
        " ('parse.v2', 'failed', NULL, NULL), ('parse.v2', 'done', NULL, NULL)"
    )
    conn.execute(
        "INSERT INTO pepsi.stage_stats (stage, processed, failed, timeouts, crashes,"
        " processing_seconds) VALUES ('fetch', 7, 2, 1, 1, 1.25), ('parse.v2', 3, 0, 0, 0, 0.5)"
        " ON CONFLICT (stage) DO UPDATE SET processed = excluded.processed,"
        " failed = excluded.failed, timeouts = excluded.timeouts, crashes = excluded.crashes,"
        " processing_seconds = excluded.processing_seconds"
    )
    conn.execute(
        "UPDATE pepsi.dispatch_stats SET stage_runs = 12, messages = 11, failed = 2,"
        " timeouts = 1, crashes = 1, requeued = 4, expired = 1"
    )
    return conn


def test_every_sql_family_is_httpds_with_the_same_help_and_samples(
    busy: psycopg.Connection,
) -> None:
    with busy.transaction():  # one snapshot for both renderings
        busy.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        sql_text = busy.execute("SELECT pepsi.metrics()").fetchone()[0]
        snap = busy.execute("SELECT pepsi.dashboard_snapshot()").fetchone()[0]
    httpd = parsed(exposition.render(exposition.families(snap, {}, 0.01)).decode())
    sql = parsed(sql_text)
    assert sql, "pepsi.metrics() rendered nothing"
    for name, (typ, doc, samples) in sql.items():
        assert name in httpd, f"{name}: rendered by pepsi.metrics(), not by pepsi-httpd"
        assert (typ, doc) == httpd[name][:2], f"{name}: type or help text differs"
        assert samples == httpd[name][2], f"{name}: samples differ"
    # What the contract asks of it: the stats and the depth by stage and status.
    assert {"pepsi_stage_processed", "pepsi_queue_depth", "pepsi_queue_messages"} <= set(sql)
    depth = sql["pepsi_queue_depth"][2]
    assert depth[("pepsi_queue_depth", ("stage", "fetch"), ("status", "pending"))] == 2
    # A registered stage with no rows still has its series, at zero.
    assert depth[("pepsi_queue_depth", ("stage", "idle"), ("status", "pending"))] == 0
    assert (
        sql["pepsi_queue_retries_due"][2][("pepsi_queue_retries_due", ("stage", "parse.v2"))] == 1
    )
    assert sql["pepsi_stage_processed"][2][("pepsi_stage_processed_total", ("stage", "fetch"))] == 7


def test_a_changed_help_text_would_be_seen() -> None:
    """The comparison has teeth: one help text typed differently is a difference."""
    a = parsed("# HELP pepsi_x_total One.\n# TYPE pepsi_x_total counter\npepsi_x_total 1\n")
    b = parsed("# HELP pepsi_x_total Two.\n# TYPE pepsi_x_total counter\npepsi_x_total 1\n")
    assert a["pepsi_x"][:2] != b["pepsi_x"][:2]


@pytest.fixture
def login_of(conn: psycopg.Connection, dsn: str) -> Iterator:
    made: list[str] = []

    def login(role: str) -> str:
        name = f"m_{uuid.uuid4().hex[:8]}"
        conn.execute(f"CREATE ROLE {name} LOGIN IN ROLE {role}")
        made.append(name)
        return make_conninfo(dsn, user=name)

    yield login
    for name in made:
        conn.execute(f"DROP ROLE {name}")


@pytest.mark.parametrize("role", ["pepsi_dispatcher", "pepsi_operator", "pepsi_dashboard"])
def test_the_front_end_roles_may_call_it(login_of, role: str) -> None:
    with psycopg.connect(login_of(role)) as c:
        assert "# TYPE pepsi_queue_depth gauge" in c.execute("SELECT pepsi.metrics()").fetchone()[0]


def test_a_stage_may_not(login_of) -> None:
    with (
        psycopg.connect(login_of("pepsi_stage")) as c,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        c.execute("SELECT pepsi.metrics()")
