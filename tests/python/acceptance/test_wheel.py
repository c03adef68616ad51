"""The package as a user gets it: build the wheel, install it into a fresh virtualenv
outside the repository, create the schema with `pepsi-queue migrate` as a superuser,
set up the roles as the README says (a dispatcher login role IN ROLE
pepsi_dispatcher, a stage role IN ROLE pepsi_stage reached through a URI
WORKER_DSN, an operator IN ROLE pepsi_operator), pass `pepsi-dispatch serve
--check` as the dispatcher's role (not a superuser) and run a 2-stage SDK pipeline
from a configuration outside the repository (no CONFIG_FILE: the workers find it
through PEPSI_CONFIG), enqueued by the operator.

Offline and quick: the wheel is built with --no-build-isolation from a copy of the
sources, installed with --no-deps, and the new venv sees this project's
dependencies through a .pth line (not its editable pepsi_dispatch: nested .pth
files are not processed, so the import resolves to the wheel).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from conftest import ROOT
from psycopg.conninfo import conninfo_to_dict, make_conninfo

SOURCES = (
    "pyproject.toml",
    "setup.py",
    "README.md",
    "LICENSE",
    "alembic.ini",
    "migrations",
    "sql",
    "pepsi_dispatch",
    "man",
    "contrib",
)

STAGES = '''#!{python}
"""A user's own 2-stage pipeline: parse, then save."""
from pepsi_dispatch.worker import Advance, Finish, run


def parse(msg):
    msg.state["words"] = len(msg.payload["text"].split())
    return Advance("save")


def save(msg):
    msg.db.execute("INSERT INTO public.saved (id, words) VALUES (%s, %s)",
                   (msg.id, msg.state["words"]))
    return Finish()


if __name__ == "__main__":
    run({{"parse": parse, "save": save}})
'''

CONF = """[database]
DSN = {dsn}

[pepsi-dispatch]
SERVICE_USER = {user}
STATS_INTERVAL = 1 s
WORKER_DSN = {worker_dsn}

[stage-parse]
PROGRAM = {program}
NEXT = save
PARALLELISM = 2

[stage-save]
PROGRAM = {program}
"""


def sh(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(cmd)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def installed() -> Iterator[Path]:
    """A venv outside the repository with the freshly built wheel installed (no deps)."""
    top = Path(tempfile.mkdtemp(prefix="pepsi-wheel-", dir="/tmp"))
    try:
        src = top / "src"
        src.mkdir()
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_data")
        for name in SOURCES:
            path = ROOT / name
            if path.is_dir():
                shutil.copytree(path, src / name, ignore=ignore)
            elif path.exists():
                shutil.copy2(path, src / name)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        pip = [sys.executable, "-m", "pip"]
        sh(
            [
                *pip,
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(top / "dist"),
                str(src),
            ],
            top,
            env,
        )
        wheel = next((top / "dist").glob("pepsi_dispatch-*.whl"))
        venv = top / "venv"
        sh([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], top, env)
        sh(
            [
                *pip,
                "--python",
                str(venv / "bin" / "python"),
                "install",
                "-q",
                "--no-deps",
                str(wheel),
            ],
            top,
            env,
        )
        site = sh(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            top,
            env,
        )
        deps = sysconfig.get_paths()["purelib"]  # this project's venv: psycopg, alembic, ...
        (Path(site.stdout.strip()) / "pepsi-test-deps.pth").write_text(deps + "\n")
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_wheel_migrate_check_and_pipeline(
    installed: Path, empty_dsn: str, request: pytest.FixtureRequest
) -> None:
    top = installed
    bin_ = top / "venv" / "bin"
    app = top / "app"
    app.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PEPSI_DSN", "PEPSI_CONFIG", "VIRTUAL_ENV")
    }
    env["HOME"] = str(app)  # no ~/.config/pepsi.conf to fall back on

    where = sh(
        [
            str(bin_ / "python"),
            "-c",
            "import pepsi_dispatch.schema.resources as r; print(r.__file__); print(r.data_root())",
        ],
        app,
        env,
    ).stdout.split()
    assert where[0].startswith(str(top / "venv")), where  # the wheel, not the checkout
    assert where[1].endswith("pepsi_dispatch/_data"), where

    for page in (
        "man1/pepsi-dispatch.1",
        "man1/pepsi-queue.1",
        "man1/pepsi-httpd.1",
        "man5/pepsi.conf.5",
    ):
        assert (top / "venv" / "share" / "man" / page).is_file(), page
    units = top / "venv" / "share" / "pepsi-dispatch" / "systemd"
    unit = units / "pepsi-dispatch.service"
    assert "ExecStartPre=" in unit.read_text(), "the systemd unit ships in the wheel"
    httpd_unit = (units / "pepsi-httpd.service").read_text()
    assert "ExecStart=/usr/local/bin/pepsi-httpd " in httpd_unit, "pepsi-httpd's unit beside it"
    assert "EnvironmentFile=/etc/pepsi-httpd.env" in httpd_unit

    # The schema from the installed package alone, into an empty database.
    ddl = sh([str(bin_ / "pepsi-queue"), "migrate", "--sql"], app, env).stdout
    assert "CREATE TABLE pepsi.workqueue" in ddl
    r = sh([str(bin_ / "pepsi-queue"), "migrate"], app, {**env, "PEPSI_DSN": empty_dsn})
    assert "schema at" in r.stderr
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.saved (id bigint PRIMARY KEY, words int)")
        conn.execute("GRANT ALL ON public.saved TO PUBLIC")
    request.addfinalizer(lambda: drop_roles(empty_dsn))
    dispatcher_dsn, worker_dsn, operator_dsn = readme_roles(empty_dsn)

    program = app / "stages.py"
    program.write_text(STAGES.format(python=bin_ / "python"))
    program.chmod(0o755)
    conf = app / "pepsi.conf"
    user = "root" if os.geteuid() == 0 else os.environ.get("USER", "")
    conf.write_text(
        CONF.format(dsn=dispatcher_dsn, user=user, program=program, worker_dsn=worker_dsn)
    )

    r = subprocess.run(
        [str(bin_ / "pepsi-dispatch"), "-c", str(conf), "serve", "--check"],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all" in r.stdout.splitlines()[-1] and "checks passed" in r.stdout
    assert "at revision" in r.stdout and "(head)" in r.stdout, r.stdout

    n = 200
    payloads = "".join(f'{{"text": "message number {i}"}}\n' for i in range(n))
    r = subprocess.run(
        [str(bin_ / "pepsi-queue"), "-c", str(conf), "enqueue", "-q", "parse", "-"],
        cwd=app,
        env={**env, "PEPSI_DSN": operator_dsn},
        input=payloads,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr

    log = (app / "dispatch.log").open("wb")
    d = subprocess.Popen(
        [str(bin_ / "pepsi-dispatch"), "-c", str(conf), "serve"],
        cwd=app,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            while True:
                counts = dict(
                    conn.execute(
                        "SELECT status, count(*) FROM pepsi.messages GROUP BY status"
                    ).fetchall()
                )
                if counts == {"done": n} or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert counts == {"done": n}, (counts, (app / "dispatch.log").read_text()[-3000:])
            (saved,) = conn.execute("SELECT count(*) FROM public.saved").fetchone()
            assert saved == n
        d.send_signal(signal.SIGTERM)
        assert d.wait(30) == 0
    finally:
        if d.poll() is None:
            d.kill()
            d.wait()
        log.close()
    text = (app / "dispatch.log").read_text()
    assert "ERROR" not in text, text[-3000:]
    _httpd_as_the_readme_web_role(bin_ / "pepsi-httpd", app, env, empty_dsn)


def _httpd_as_the_readme_web_role(
    httpd: Path, app: Path, env: dict[str, str], superuser_dsn: str
) -> None:
    """The installed pepsi-httpd, as the README's pepsi_dashboard login role, logging
    to a file it creates (-l): /metrics answers with the stage the pipeline ran."""
    web_dsn = make_conninfo(
        superuser_dsn, user=_role_names(superuser_dsn)["web"], password="change-me"
    )
    logfile = app / "logs" / "httpd.log"
    logfile.parent.mkdir()
    p = subprocess.Popen(
        [str(httpd), "-l", str(logfile), "--listen", "127.0.0.1:0"],
        cwd=app,
        env={**env, "PEPSI_DSN": web_dsn},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        port = None
        while port is None and time.monotonic() < deadline and p.poll() is None:
            text = logfile.read_text() if logfile.exists() else ""
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", text)
            port = int(found.group(1)) if found else None
            time.sleep(0.1)
        assert port, (p.poll(), logfile.read_text() if logfile.exists() else "no log file")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            metrics = r.read().decode()
        assert 'pepsi_stage_processed_total{stage="parse"}' in metrics, metrics[:3000]
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
    assert err == b"", err  # everything went to the file
    assert "INFO pepsi-httpd[" in logfile.read_text()


def _role_names(superuser_dsn: str) -> dict[str, str]:
    db = conninfo_to_dict(superuser_dsn)["dbname"]
    return {"dispatcher": f"{db}_d", "worker": f"{db}_w", "operator": f"{db}_o", "web": f"{db}_h"}


def drop_roles(superuser_dsn: str) -> None:
    """Drop the roles of :func:`readme_roles` (before their database goes)."""
    with psycopg.connect(superuser_dsn, autocommit=True) as conn:
        for name in _role_names(superuser_dsn).values():
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
                conn.execute(f"DROP OWNED BY {name}")
                conn.execute(f"DROP ROLE {name}")


def readme_roles(superuser_dsn: str) -> tuple[str, str, str]:
    """The README's role set-up (after a superuser migrated): the dispatcher's login
    role, the workers' (as a URI, the form every language's driver takes) and an
    operator's. Roles are cluster-wide: named for this database."""
    params = conninfo_to_dict(superuser_dsn)
    db = params["dbname"]
    names = _role_names(superuser_dsn)
    with psycopg.connect(superuser_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {names['dispatcher']} LOGIN IN ROLE pepsi_dispatcher")
        conn.execute(
            f"CREATE ROLE {names['worker']} LOGIN PASSWORD 'change-me' IN ROLE pepsi_stage"
        )
        conn.execute(f"CREATE ROLE {names['operator']} LOGIN IN ROLE pepsi_operator")
        conn.execute(
            f"CREATE ROLE {names['web']} LOGIN PASSWORD 'change-me' IN ROLE pepsi_dashboard"
        )
        conn.execute(f"GRANT ALL ON public.saved TO {names['worker']}")
    host = params.get("host", "127.0.0.1")
    port = params.get("port", "5432")
    worker_uri = (
        f"postgresql://{names['worker']}:change-me@{host}:{port}/{db}"
        if not host.startswith("/")
        else f"postgresql://{names['worker']}:change-me@/{db}?host={host}&port={port}"
    )
    return (
        make_conninfo(superuser_dsn, user=names["dispatcher"]),
        worker_uri,
        make_conninfo(superuser_dsn, user=names["operator"]),
    )
