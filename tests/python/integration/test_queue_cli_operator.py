"""pepsi-queue for the operator's day, as a real process: list with each filter
and its paging, durations, failure groups and their raw reasons, typo checks of
--stage, cancel/requeue --id of unknown ids, migrate --current and --sql, one
version string, and the pepsi_operator role both ways (and the error that names
it)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pepsi_dispatch.config import ConfigError, parse_duration

BIN = Path(sys.executable).parent


@pytest.fixture
def pq(dsn: str, tmp_path: Path):
    """Run pepsi-queue against ``dsn`` (or the ``dsn=`` given); the CompletedProcess."""

    def run(*args: str, as_dsn: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {
            "PEPSI_DSN": as_dsn or dsn,
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "LANG": "C.UTF-8",
        }
        return subprocess.run(
            [str(BIN / "pepsi-queue"), *args], env=env, capture_output=True, text=True, timeout=60
        )

    return run


def ids_of(r: subprocess.CompletedProcess[str]) -> list[int]:
    assert r.returncode == 0, r.stderr
    return [row["workqueue_id"] for row in json.loads(r.stdout)]


def seed(conn: psycopg.Connection) -> dict[str, int]:
    conn.execute(
        "SELECT pepsi.register_stages(1, ARRAY['parse', 'store'], NULL, NULL, NULL, NULL,"
        " NULL, NULL)"
    )
    rows = {}
    for name, stage, status, payload, age in [
        ("old_pending", "parse", "pending", {"customer": 7}, "3 h"),
        ("pending", "parse", "pending", {"customer": 8}, "5 min"),
        ("failed", "store", "failed", {"customer": 7}, "20 min"),
        ("done", "store", "done", {}, "1 min"),
    ]:
        rows[name] = conn.execute(
            "INSERT INTO pepsi.workqueue (stage, status, payload, state, created_at,"
            ' updated_at) VALUES (%s, %s, %s, \'{"error": "bad input n=3"}\','
            " now() - %s::interval, now() - %s::interval) RETURNING workqueue_id",
            (stage, status, json.dumps(payload), age, age),
        ).fetchone()[0]
    return rows


def test_list_with_each_filter_and_paging(pq, conn) -> None:
    m = seed(conn)
    assert ids_of(pq("list", "--json")) == [m["done"], m["failed"], m["pending"], m["old_pending"]]
    assert ids_of(pq("list", "--status", "pending", "--json")) == [m["pending"], m["old_pending"]]
    assert ids_of(pq("list", "--status", "done,failed", "--json")) == [m["done"], m["failed"]]
    assert ids_of(pq("list", "--stage", "store", "--json")) == [m["done"], m["failed"]]
    assert ids_of(pq("list", "--older-than", "1h30m", "--json")) == [m["old_pending"]]
    assert ids_of(pq("list", "--older-than", "10m", "--json")) == [m["failed"], m["old_pending"]]
    got = ids_of(pq("list", "--where", '{"customer": 7}', "--json"))
    assert got == [m["failed"], m["old_pending"]]
    r = pq("list", "--limit", "2")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 3, r.stdout  # header + 2
    assert f"--before {m['failed']}" in r.stderr
    assert ids_of(pq("list", "--before", str(m["failed"]), "--json")) == [
        m["pending"],
        m["old_pending"],
    ]
    r = pq("list", "--status", "pendng")
    assert r.returncode == 2 and "'pendng' is not a status" in r.stderr
    r = pq("list", "--where", "[1]")
    assert r.returncode == 2 and "JSON object" in r.stderr
    r = pq("list", "--older-than", "ten minutes")
    assert r.returncode == 2 and "is not a duration" in r.stderr


def test_durations_parse_both_forms() -> None:
    for text, seconds in [
        ("90s", 90),
        ("10m", 600),
        ("1h30m", 5400),
        ("2d", 172800),
        ("5 min", 300),
        ("30", 30),
        ("1 min 30 s", 90),
        ("500ms", 0.5),
    ]:
        assert parse_duration(text) == seconds, text
    for bad in ("", "10x", "m", "1h30", "-5m"):
        with pytest.raises(ConfigError):
            parse_duration(bad)


def test_durations_on_the_command_line(pq, conn) -> None:
    seed(conn)
    r = pq("enqueue", "parse", "{}", "--in", "1h30m")
    assert r.returncode == 0, r.stderr
    (due,) = conn.execute(
        "SELECT timeout - now() FROM pepsi.messages WHERE workqueue_id = %s",
        (int(r.stdout),),
    ).fetchone()
    assert timedelta(minutes=89) < due <= timedelta(minutes=90)
    # failed 20 min ago, done 1 min ago: only the first is older than 90s
    assert pq("purge", "--older-than", "90s", "--dry-run").stdout == "would purge 1 message(s)\n"
    assert pq("status", "--watch", "--interval", "1s", "--count", "1").returncode == 0


def test_failure_groups_and_their_raw_reasons(pq, conn) -> None:
    conn.execute(
        "INSERT INTO pepsi.workqueue (stage, status, state) SELECT 'store', 'failed',"
        " jsonb_build_object('error', 'bad input n=' || g) FROM generate_series(200, 229) g"
    )
    r = pq("failed", "--by-reason")
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.splitlines() if "store" in x]
    assert len(lines) == 1 and lines[0].split()[0] == "30" and "bad input n=<n>" in lines[0]
    assert "e.g. bad input n=229" in r.stdout
    groups = json.loads(pq("failed", "--by-reason", "--json").stdout)
    assert groups[0]["count"] == 30 and groups[0]["examples"][0] == "bad input n=229"
    r = pq("failed", "--reason", "bad input n=<n>", "--limit", "3", "--json")
    assert [x["error"] for x in json.loads(r.stdout)] == [
        "bad input n=229",
        "bad input n=228",
        "bad input n=227",
    ]


@pytest.mark.parametrize("command", ["failed", "requeue", "cancel", "list"])
def test_stage_typos_get_a_suggestion(pq, conn, command: str) -> None:
    seed(conn)
    r = pq(command, "--stage", "prase")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "unknown stage 'prase'" in r.stderr and "did you mean 'parse'?" in r.stderr
    confirm = ["--yes"] if command in ("requeue", "cancel") else []  # no terminal here
    assert pq(command, "--stage", "parse", *confirm).returncode == 0


def test_cancel_and_requeue_of_unknown_ids_exit_non_zero(pq, conn) -> None:
    m = seed(conn)
    r = pq("cancel", "--id", "99999")
    assert r.returncode == 1 and "cancel: no message 99999" in r.stderr
    r = pq("cancel", "--id", str(m["pending"]), "--id", str(m["done"]))
    assert r.returncode == 1 and r.stdout == f"cancelled 1 message(s): {m['pending']}\n"
    assert f"message {m['done']} is done, not pending or paused" in r.stderr
    assert pq("requeue", "--id", "99999").returncode == 1
    assert pq("requeue", "--id", str(m["failed"])).returncode == 0
    assert pq("show", "99999").returncode == 1


def test_migrate_current_and_sql_keep_stdout_clean(pq, dsn: str) -> None:
    r = pq("migrate", "--current")
    assert r.returncode == 0 and r.stdout.strip().endswith("(head)"), r.stdout + r.stderr
    r = pq("migrate", "--sql")
    assert r.returncode == 0
    assert "Running upgrade" in r.stderr
    for line in r.stdout.splitlines():
        assert not line.startswith(("Running", "INFO", "schema at")), line
    assert r.stdout.rstrip().endswith("COMMIT;")


def test_one_version_convention() -> None:
    seen = set()
    for prog in ("pepsi-dispatch", "pepsi-queue", "pepsi-httpd"):
        for flag in ("-v", "-V", "--version"):
            r = subprocess.run([str(BIN / prog), flag], capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, (prog, flag, r.stderr)
            name, version = r.stdout.split()
            assert name == prog
            seen.add(version)
    assert len(seen) == 1, seen


@pytest.fixture
def login_roles(dsn: str, conn: psycopg.Connection):
    """An operator's login role and a login role with no pepsi role; dropped after."""
    tag = uuid.uuid4().hex[:8]
    names = {"operator": f"op_{tag}", "nobody": f"nobody_{tag}"}
    conn.execute(f"CREATE ROLE {names['operator']} LOGIN IN ROLE pepsi_operator")
    conn.execute(f"CREATE ROLE {names['nobody']} LOGIN")
    conn.execute(f"GRANT USAGE ON SCHEMA pepsi TO {names['nobody']}")
    yield {k: (v, make_conninfo(dsn, user=v)) for k, v in names.items()}
    for name in names.values():
        conn.execute(f"DROP OWNED BY {name}")
        conn.execute(f"DROP ROLE {name}")


def test_operator_role_both_ways(pq, conn, login_roles) -> None:
    m = seed(conn)
    _, op = login_roles["operator"]
    r = pq("enqueue", "parse", '{"by": "operator"}', as_dsn=op)
    assert r.returncode == 0, r.stderr
    for args in (
        ("status",),
        ("list", "--stage", "parse"),
        ("show", str(m["failed"])),
        ("failed", "--by-reason"),
        ("requeue", "--id", str(m["failed"])),
        ("cancel", "--id", str(m["pending"])),
        ("purge", "--status", "done", "--yes"),
    ):
        r = pq(*args, as_dsn=op)
        assert r.returncode == 0, (args, r.stderr)
    with psycopg.connect(op, autocommit=True) as oc:
        for sql in (
            "SELECT * FROM pepsi.claim(1, ARRAY['parse'], ARRAY[1])",
            "SELECT pepsi.release(1, NULL)",
            "SELECT pepsi.finish(1, 'parse')",
            "UPDATE pepsi.workqueue SET stage = 'store'",
            "SELECT * FROM pepsi.config",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                oc.execute(sql)
    nobody, plain = login_roles["nobody"]
    r = pq("enqueue", "parse", "{}", "--force", as_dsn=plain)
    assert r.returncode == 1
    assert "permission denied" in r.stderr
    assert f"GRANT pepsi_operator TO {nobody}" in r.stderr, r.stderr
