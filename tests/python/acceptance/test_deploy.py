"""First use and operation: workers find the dispatcher's file through
PEPSI_CONFIG, a worker without its stage fails nothing, a stage failing everything is
an ERROR, start-up checks (serve and serve --check), WORKER_DSN with a pepsi_stage
login, sd_notify, LOG_FORMAT = json and journald lines.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from dispatch_harness import (  # noqa: F401
    DISPATCH,
    PYTHON,
    ROOT,
    Harness,
    harness_fixture,
    proc_env,
    wait_until,
)
from psycopg.conninfo import make_conninfo

from pepsi_dispatch.coordinator import sdnotify

SDK_WORKER = ROOT / "tests/python/support/workers/sdk_scripted_worker.py"
PLAIN = {"plan": {"a": {"op": "advance", "to": "b"}, "b": {"op": "finish"}}}
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop privileges")


def two_stages(h: Harness, program: str | None = None, stage_a=None, **dispatch) -> Path:
    program = program or f"{PYTHON} {SDK_WORKER}"
    return h.conf(
        {"a": {"PROGRAM": program, "NEXT": "b", **(stage_a or {})}, "b": {"PROGRAM": program}},
        **dispatch,
    )


# --------------------------------------------------------------------------- first use


def test_workers_find_the_dispatchers_file_through_pepsi_config(h: Harness) -> None:
    conf = two_stages(h)  # no CONFIG_FILE: workers are started without -c
    assert "CONFIG_FILE" not in conf.read_text()
    d = h.start(conf, env={"HOME": str(h.tmp)})
    h.enqueue("a", [PLAIN] * 20)
    assert h.wait_all(timeout=60) == {"done": 20}
    pids = [p for ps in d.workers().values() for p in ps]
    envs = [proc_env(p) for p in pids]
    assert any(e.get("PEPSI_CONFIG") == str(conf) for e in envs), envs
    assert "ERROR" not in d.log()
    assert d.terminate() == 0


def test_worker_without_its_stage_exits_78_and_fails_nothing(h: Harness) -> None:
    other = h.conf({"z": {"PROGRAM": "/bin/true"}}, name="other.conf")
    conf = two_stages(h, program=f"{PYTHON} {SDK_WORKER} -c {other}")
    d = h.start(conf)
    h.enqueue("a", [PLAIN] * 5)
    wait_until(lambda: "found no stage a in its configuration" in d.log(), 30, message=d.tail)
    line = next(x for x in d.log().splitlines() if "found no stage a" in x)
    assert " ERROR " in line and "exit 78" in line and "PEPSI_CONFIG" in line, line
    assert "holding off new workers" in d.log()
    wait_until(lambda: h.counts() == {"pending": 5}, 10, message=lambda: str(h.counts()))
    assert d.terminate() == 0
    assert h.counts() == {"pending": 5}


def test_stage_failing_every_message_is_reported_at_error(h: Harness) -> None:
    conf = two_stages(h, STATS_INTERVAL="1 s")
    d = h.start(conf)
    h.enqueue("a", [{"plan": {"a": {"op": "fail", "reason": "no parser for this"}}}] * 5)
    # The five failures usually land in one STATS_INTERVAL; on a loaded box
    # they may be split over two (each interval then fails all of its own).
    every = re.compile(r"all [1-5] message\(s\)")
    wait_until(lambda: every.search(d.log()), 30, message=d.tail)
    line = next(x for x in d.log().splitlines() if every.search(x))
    assert " ERROR " in line and "stage a:" in line and "no parser for this" in line, line
    assert d.terminate() == 0


# --------------------------------------------------------------------------- WORKER_DSN


@pytest.fixture
def stage_logins(pg_admin_dsn: str) -> Iterator[list[str]]:
    """Two login roles, members of pepsi_stage (cluster-wide: dropped afterwards)."""
    names = [f"pepsi_w_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        for name in names:
            admin.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'w' IN ROLE pepsi_stage")
    try:
        yield names
    finally:
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            for name in names:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                    (name,),
                )
                admin.execute(f"DROP ROLE IF EXISTS {name}")


def test_worker_dsn_runs_the_pipeline_as_a_stage_role(h: Harness, stage_logins: list[str]) -> None:
    role_a, role_all = stage_logins
    dsn_a = make_conninfo(h.dsn, user=role_a, password="w")
    dsn_all = make_conninfo(h.dsn, user=role_all, password="w")
    # Idle workers stay (and stay connected) while the test looks at them.
    conf = two_stages(
        h, stage_a={"WORKER_DSN": dsn_a}, WORKER_DSN=dsn_all, WORKER_IDLE_TIMEOUT="60 s"
    )
    d = h.start(conf, env={"PGPASSWORD": "dispatcher-secret", "PGPASSFILE": "/nonexistent"})
    h.enqueue("a", [PLAIN] * 30)
    assert h.wait_all(timeout=60) == {"done": 30}
    users = dict(
        h.conn.execute(
            "SELECT application_name, usename FROM pg_stat_activity"
            " WHERE application_name LIKE 'pepsi-worker %'"
        ).fetchall()
    )
    assert users == {"pepsi-worker a": role_a, "pepsi-worker b": role_all}, users
    for stage, pids in d.workers().items():
        for pid in pids:
            env = proc_env(pid)
            assert env["PEPSI_DSN"] == (dsn_a if stage == "a" else dsn_all)
            assert "PGPASSWORD" not in env and "PGPASSFILE" not in env, env
    assert d.terminate() == 0

    with psycopg.connect(dsn_all, autocommit=True) as conn:
        for fn in ("claim", "release", "reset_orphans"):
            allowed = conn.execute(
                "SELECT bool_or(has_function_privilege(p.oid, 'EXECUTE')) FROM pg_proc p"
                " JOIN pg_namespace n ON n.oid = p.pronamespace"
                " WHERE n.nspname = 'pepsi' AND p.proname = %s",
                (fn,),
            ).fetchone()[0]
            assert allowed is False, fn
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT pepsi.reset_orphans(0, false, interval '1 s')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT pepsi.release(0, ARRAY[]::bigint[])")


# --------------------------------------------------------------------------- start-up checks


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A directory every user can traverse (pytest's tmp_path is under a 0700 one)."""
    path = Path(tempfile.mkdtemp(prefix="pepsi-check-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        subprocess.run(["rm", "-rf", str(path)], check=False)


def write_program(path: Path, text: str, mode: int = 0o755) -> str:
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def venv(path: Path, python: str) -> Path:
    subprocess.run([python, "-m", "venv", "--without-pip", str(path)], check=True, timeout=60)
    return path / "bin" / "python"


def bad_programs(world: Path) -> tuple[Path, dict[str, str]]:
    root_python = os.path.realpath(sys._base_executable)  # under /root (0700) here
    # A venv anyone can reach whose python is a link into /root, and one made
    # from the system's python, which the service user can run.
    root_venv = venv(world / "root-venv", root_python)
    good_venv = venv(world / "venv", "/usr/bin/python3")
    progs = {
        "good": write_program(world / "good.sh", "#!/bin/sh\nexit 0\n"),
        "goodvenv": write_program(world / "ok.py", f"#!{good_venv}\nprint(1)\n"),
        "venv": write_program(world / "stages.py", f"#!{root_venv}\nprint(1)\n"),
        "missing": str(world / "missing"),
        "noexec": write_program(world / "noexec.sh", "#!/bin/sh\n", 0o644),
        "nopath": "no-such-program-anywhere --flag",
        "badenv": write_program(world / "env.sh", "#!/usr/bin/env no-such-interpreter\n"),
    }
    lines = ["[pepsi-dispatch]", "SERVICE_USER = nobody"]
    for name, program in progs.items():
        lines += [f"[stage-{name}]", f"PROGRAM = {program}"]
    conf = world / "pepsi.conf"
    conf.write_text("\n".join(lines) + "\n")
    conf.chmod(0o644)
    return conf, progs


def run_dispatch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("PEPSI_CONFIG", "PEPSI_DSN")}
    full.update(env or {})
    return subprocess.run(
        [str(DISPATCH), *args], capture_output=True, text=True, timeout=60, env=full
    )


@needs_root
def test_check_names_each_program_problem_as_the_service_user(world_dir: Path) -> None:
    if os.access(os.path.realpath(sys._base_executable), os.X_OK, effective_ids=False) and (
        os.stat(Path.home()).st_mode & 0o001
    ):
        pytest.skip("this Python is runnable by everyone here")
    conf, progs = bad_programs(world_dir)
    r = run_dispatch("-c", str(conf), "serve", "--check", env={"PEPSI_DSN": "host=/nonexistent"})
    assert r.returncode == 2, r.stdout + r.stderr
    out = r.stdout
    assert "ok   service user: running as nobody" in out
    assert f"ok   stage good: PROGRAM {progs['good']} runnable by nobody" in out
    assert f"ok   stage goodvenv: PROGRAM {progs['goodvenv']} runnable by nobody" in out
    root_python = os.path.realpath(sys._base_executable)
    assert (
        f"FAIL stage venv: interpreter {world_dir}/root-venv/bin/python of PROGRAM"
        f" {progs['venv']} (its #! line) is not executable by nobody: directory /root is not"
        f" searchable by nobody (it resolves to {root_python})"
    ) in out, out
    assert f"FAIL stage missing: PROGRAM {progs['missing']} does not exist" in out
    assert f"(set at {conf}:" in out and "[stage-missing] PROGRAM)" in out, out
    assert (
        f"FAIL stage noexec: PROGRAM {progs['noexec']} is not executable by nobody:"
        " no execute permission for nobody (-rw-r--r--, owner root)"
    ) in out
    assert "FAIL stage nopath: PROGRAM 'no-such-program-anywhere' is not found on PATH" in out
    assert "FAIL stage badenv: interpreter no-such-interpreter of PROGRAM" in out
    assert "FAIL database: cannot connect" in out
    assert out.splitlines()[-1].startswith("pepsi-dispatch: ")

    # serve itself refuses at start, with the same causes, before connecting.
    r = run_dispatch("-c", str(conf), "-L", "ERROR", "serve")
    assert r.returncode == 2
    assert r.stderr.startswith("pepsi-dispatch: error: stage venv: interpreter")
    assert "directory /root is not searchable by nobody" in r.stderr


def test_check_database_cases(
    dsn: str, empty_dsn: str, stage_logins: list[str], world_dir: Path
) -> None:
    program = write_program(world_dir / "good.sh", "#!/bin/sh\nexit 0\n")
    conf = world_dir / "pepsi.conf"
    conf.write_text(f"[pepsi-dispatch]\nSERVICE_USER = root\n[stage-a]\nPROGRAM = {program}\n")
    user = os.environ.get("USER", "root")
    if os.geteuid() != 0:
        conf.write_text(conf.read_text().replace("= root", f"= {user}"))

    def check(target: str) -> tuple[int, str]:
        r = run_dispatch(
            "-c", str(conf), "-L", "ERROR", "serve", "--check", env={"PEPSI_DSN": target}
        )
        return r.returncode, r.stdout

    rc, out = check(dsn)
    assert rc == 0, out
    assert "ok   schema: at revision" in out and "ok   grants: role" in out
    assert out.splitlines()[-1].startswith("pepsi-dispatch: all ")

    rc, out = check(empty_dsn)
    assert rc == 2 and "FAIL schema:" in out and "run 'pepsi-queue migrate'" in out, out

    # An older schema: its missing functions are named as such, not as grants
    # a superuser would lack.
    migrate = [str(Path(sys.executable).parent / "pepsi-queue"), "migrate", "--to", "0040"]
    subprocess.run(migrate, env={**os.environ, "PEPSI_DSN": empty_dsn}, check=True, timeout=120)
    rc, out = check(empty_dsn)
    assert rc == 2 and "is at revision 0040" in out, out
    assert "FAIL functions: the schema lacks pepsi.replicas_away; run 'pepsi-queue migrate'" in out
    assert "GRANT pepsi_dispatcher" not in out, out

    rc, out = check(make_conninfo(dsn, user=stage_logins[0], password="w"))
    assert rc == 2, out
    assert f"FAIL grants: role {stage_logins[0]} lacks EXECUTE on pepsi.register_dispatcher" in out
    assert f"GRANT pepsi_dispatcher TO {stage_logins[0]}" in out

    rc, out = check("host=/nonexistent-socket-dir dbname=x")
    assert rc == 2 and "FAIL database: cannot connect" in out, out

    conf.write_text(conf.read_text() + "[stage-a\n")
    rc, out = check(dsn)
    assert rc == 2 and out.startswith("FAIL configuration:"), out


def test_check_warns_of_a_program_set_only_in_the_overlay(h: Harness) -> None:
    # serve starts anyway and holds that stage off (test_dispatch_failures'
    # test_missing_program_cools_down_then_recovers); --check says so.
    conf = h.conf(h.pipeline(["a"]))
    missing = h.tmp / "no-such-stage-b"
    h.set_config("stage-b", "PROGRAM", str(missing))
    r = run_dispatch("-c", str(conf), "serve", "--check", env={"PEPSI_DSN": h.dsn})
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"warn database overlay: stage b: PROGRAM {missing} does not exist" in r.stdout
    assert "pepsi.config row [stage-b] PROGRAM" in r.stdout, r.stdout
    assert r.stdout.splitlines()[-1].endswith("checks passed (1 warning)"), r.stdout

    h.set_config("stage-b", "PROGRAM", h.pipeline(["a"])["a"]["PROGRAM"])
    r = run_dispatch("-c", str(conf), "serve", "--check", env={"PEPSI_DSN": h.dsn})
    assert r.returncode == 0, r.stdout + r.stderr
    assert not [x for x in r.stdout.splitlines() if x.startswith("warn")], r.stdout


def test_check_fails_a_graph_the_overlay_breaks(h: Harness) -> None:
    """A pepsi.config row that breaks the graph (a NEXT to no stage, a value out
    of range): serve refuses it at start, and serve --check says so as a failed
    check, exit 2, naming the row, rather than failing itself."""
    conf = h.conf(h.pipeline(["a", "b"]))
    for option, value, what in (("NEXT", "zzz", "zzz"), ("PARALLELISM", "0", "PARALLELISM")):
        h.set_config("stage-b", option, value)
        r = run_dispatch("-c", str(conf), "serve", "--check", env={"PEPSI_DSN": h.dsn})
        assert r.returncode == 2, r.stdout + r.stderr
        assert "internal error" not in r.stdout + r.stderr
        failed = [x for x in r.stdout.splitlines() if "database overlay" in x]
        assert failed and "pepsi.config" in failed[0] and what in failed[0], r.stdout
        h.conn.execute("DELETE FROM pepsi.config WHERE section = 'stage-b'")


def test_no_file_and_no_stage_refuses_to_start(tmp_path: Path) -> None:
    r = run_dispatch("serve", env={"HOME": str(tmp_path)})
    if Path("/etc/pepsi.conf").exists():
        pytest.skip("/etc/pepsi.conf exists here")
    assert r.returncode == 2
    assert "no configuration file found (looked at: -c (not given)" in r.stderr
    assert f"{tmp_path}/.config/pepsi.conf, /etc/pepsi.conf" in r.stderr


# --------------------------------------------------------------------------- sd_notify


def _receiver(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + address[1:] if address.startswith("@") else address)
    sock.settimeout(10)
    return sock


@pytest.mark.parametrize("kind", ["path", "abstract"])
def test_sd_notify_datagrams(tmp_path: Path, kind: str) -> None:
    address = str(tmp_path / "notify") if kind == "path" else f"@pepsi-{uuid.uuid4().hex}"
    with _receiver(address) as sock:
        assert sdnotify.notify("READY=1\nSTATUS=x", {"NOTIFY_SOCKET": address})
        assert sock.recv(4096) == b"READY=1\nSTATUS=x"
    assert not sdnotify.notify("READY=1", {})  # not under systemd: nothing to do
    dog = sdnotify.SystemdWatchdog({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "4000000"})
    assert dog.interval == 2.0
    assert (
        sdnotify.SystemdWatchdog(
            {"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"}
        ).interval
        == 0
    )  # meant for another pid


def test_dispatcher_notifies_ready_watchdog_stopping(h: Harness) -> None:
    address = f"@pepsi-{uuid.uuid4().hex}"
    with _receiver(address) as sock:
        d = h.start(two_stages(h), env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "200000"})
        first = sock.recv(4096).decode()
        assert first.startswith("READY=1\n") and f"MAINPID={d.pid}" in first, first
        assert sock.recv(4096) == b"WATCHDOG=1"
        assert sock.recv(4096) == b"WATCHDOG=1"  # from the loop, every 0.1 s
        d.proc.send_signal(15)
        while (msg := sock.recv(4096)) == b"WATCHDOG=1":
            pass
        assert msg == b"STOPPING=1"
        assert d.wait_exit() == 0


# --------------------------------------------------------------------------- logs


def test_log_format_json(h: Harness) -> None:
    conf = two_stages(h, LOG_FORMAT="json")
    d = h.start(conf)
    h.enqueue("a", [{"plan": {"a": {"op": "advance", "to": "b", "print": "hello"}}}] * 3)
    h.wait_all(timeout=60)
    assert d.terminate() == 0
    records = [json.loads(line) for line in d.log().splitlines() if line.strip()]
    assert records and all(
        set(r) >= {"time", "level", "program", "pid", "logger", "message"} for r in records
    )
    assert any(r["message"].endswith("hello") for r in records)  # a worker's stderr, relayed
    assert records[0]["time"][23:] in ("+00:00",) or records[0]["time"][23] in "+-"


def test_journald_lines_carry_priority_not_timestamp(tmp_path: Path) -> None:
    code = (
        "import logging, os, sys\n"
        "st = os.fstat(2)\n"
        "os.environ['JOURNAL_STREAM'] = f'{st.st_dev}:{st.st_ino}'\n"
        "from pepsi_dispatch.cli.logsetup import setup_logging\n"
        "setup_logging('DEBUG')\n"
        "log = logging.getLogger('x')\n"
        "log.error('bad'); log.warning('meh'); log.info('fine'); log.debug('detail')\n"
    )
    out = tmp_path / "stderr"
    with out.open("wb") as f:
        subprocess.run([sys.executable, "-c", code], stderr=f, check=True, timeout=30)
    lines = out.read_text().splitlines()
    pid = r"\[\d+\]"
    import re

    for line, prio, level in zip(lines, "3467", ("ERROR", "WARNING", "INFO", "DEBUG"), strict=True):
        assert re.fullmatch(rf"<{prio}>{level} pepsi-dispatch{pid}: \w+", line), line
    # Not the journal's stream (a file): timestamps with the UTC offset, no prefix.
    with out.open("wb") as f:
        subprocess.run(
            [sys.executable, "-c", code.replace("st.st_ino", "st.st_ino + 1")],
            stderr=f,
            check=True,
            timeout=30,
        )
    first = out.read_text().splitlines()[0]
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d ERROR ", first), first


# --------------------------------------------------------------------------- migrate


def test_migrate_up_down_and_errors(empty_dsn: str, tmp_path: Path) -> None:
    queue = DISPATCH.with_name("pepsi-queue")
    env = {k: v for k, v in os.environ.items() if k != "PEPSI_CONFIG"}
    env.update(PEPSI_DSN=empty_dsn, HOME=str(tmp_path))

    def migrate(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(queue), "migrate", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def version() -> str:
        with psycopg.connect(empty_dsn) as conn:
            return conn.execute("SELECT version_num FROM alembic_version").fetchone()[0]

    r = migrate("--to", "0005")
    assert r.returncode == 0 and version() == "0005", r.stderr
    assert r.stderr.splitlines()[0].startswith("Running upgrade  -> 0001, "), r.stderr
    r = migrate()
    assert r.returncode == 0, r.stderr
    head = r.stderr.splitlines()[-1].removeprefix("schema at ")
    assert version() == head
    r = migrate("--to", "0005")  # older than the database: a downgrade
    assert r.returncode == 0 and version() == "0005", r.stderr
    assert "Running downgrade" in r.stderr
    r = migrate("--to", "nonsense")
    assert r.returncode == 2
    assert (
        r.stderr == "pepsi-queue: error: migrate: Can't locate revision identified by 'nonsense'\n"
    )
