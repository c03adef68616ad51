"""One message list: ``pepsi-queue list`` and pepsi-httpd's message page read the same
function, ``pepsi.list_messages``, with one meaning of ``older_than`` (last updated
before: in its status that long, as ``purge --older-than``) and one cap on rows
(``MESSAGE_LIST_MAX_ROWS``, which the function itself enforces).

Each caller runs under its own role (pepsi_operator, pepsi_dashboard), so a
grant missing for either shows here too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pepsi_dispatch.cli.messages import MESSAGE_LIST_MAX_ROWS
from pepsi_dispatch.httpd.app import App
from pepsi_dispatch.httpd.server import _list_filters

BIN = Path(sys.executable).parent


@pytest.fixture
def logins(conn: psycopg.Connection, dsn: str) -> Iterator[dict[str, str]]:
    """role -> a DSN of a fresh login role in that pepsi role; dropped after."""
    tag = uuid.uuid4().hex[:8]
    names = {"pepsi_operator": f"op_{tag}", "pepsi_dashboard": f"web_{tag}"}
    for group, name in names.items():
        conn.execute(f"CREATE ROLE {name} LOGIN IN ROLE {group}")
    yield {group: make_conninfo(dsn, user=name) for group, name in names.items()}
    for name in names.values():
        conn.execute(f"DROP OWNED BY {name}")
        conn.execute(f"DROP ROLE {name}")


def seed(conn: psycopg.Connection) -> dict[str, int]:
    """Rows whose age by created_at and by updated_at disagree."""
    rows = {}
    for name, status, created, updated in [
        ("old_but_just_moved", "pending", "3 h", "1 min"),
        ("new_but_stuck", "paused", "20 min", "20 min"),
        ("old_and_stuck", "failed", "3 h", "2 h"),
    ]:
        rows[name] = conn.execute(
            "INSERT INTO pepsi.workqueue (stage, status, timeout, created_at, updated_at)"
            " VALUES ('s', %s, CASE WHEN %s = 'paused' THEN now() END,"
            " now() - %s::interval, now() - %s::interval) RETURNING workqueue_id",
            (status, status, created, updated),
        ).fetchone()[0]
    return rows


def cli_ids(dsn: str, home: Path, *args: str) -> list[int]:
    """The ids ``pepsi-queue list ARGS --json`` prints, run as a real process."""
    env = {"PEPSI_DSN": dsn, "PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}
    r = subprocess.run(
        [str(BIN / "pepsi-queue"), "list", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return [row["workqueue_id"] for row in json.loads(r.stdout)]


def dashboard_ids(dsn: str, query: str) -> list[int]:
    """The ids pepsi-httpd's ``/api/messages?QUERY`` lists (its parser, its App)."""
    app = App(dsn, allow_actions=False)
    return [r["workqueue_id"] for r in app.messages(*_list_filters(parse_qs(query)))]


def test_both_callers_mean_last_updated_by_older_than(
    conn: psycopg.Connection, logins: dict[str, str], tmp_path: Path
) -> None:
    m = seed(conn)
    want = [m["old_and_stuck"], m["new_but_stuck"]]  # newest first
    assert cli_ids(logins["pepsi_operator"], tmp_path, "--older-than", "10m") == want
    assert dashboard_ids(logins["pepsi_dashboard"], "older_than=10m") == want
    # And every other filter the two share gives the same rows.
    for args, query in [
        (("--status", "paused"), "status=paused"),
        (("--stage", "s", "--limit", "2"), "stage=s&limit=2"),
        (("--before", str(m["old_and_stuck"])), f"before={m['old_and_stuck']}"),
    ]:
        assert cli_ids(logins["pepsi_operator"], tmp_path, *args) == dashboard_ids(
            logins["pepsi_dashboard"], query
        ), args


def test_one_cap_for_both_callers(
    conn: psycopg.Connection, logins: dict[str, str], tmp_path: Path
) -> None:
    seed(conn)
    sql = "SELECT count(*) FROM pepsi.list_messages(max_rows => %s)"
    assert conn.execute(sql, (MESSAGE_LIST_MAX_ROWS,)).fetchone()[0] == 3
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        conn.execute(sql, (MESSAGE_LIST_MAX_ROWS + 1,))
    # pepsi-httpd asks for no more than the function gives...
    assert (
        _list_filters(parse_qs(f"limit={MESSAGE_LIST_MAX_ROWS * 10}"))[5] == MESSAGE_LIST_MAX_ROWS
    )
    assert len(dashboard_ids(logins["pepsi_dashboard"], "limit=999999")) == 3
    # ...and pepsi-queue list refuses more before asking.
    assert (
        len(cli_ids(logins["pepsi_operator"], tmp_path, "--limit", str(MESSAGE_LIST_MAX_ROWS))) == 3
    )
    r = subprocess.run(
        [str(BIN / "pepsi-queue"), "list", "--limit", str(MESSAGE_LIST_MAX_ROWS + 1)],
        env={"PEPSI_DSN": logins["pepsi_operator"], "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--limit" in r.stderr, r.stderr
