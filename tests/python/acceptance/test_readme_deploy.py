"""The README's "Deploying" steps, followed as written by an administrator.

Every fenced block of README.md's ``## Deploying`` section is run: each ``sh``
command through :data:`COMMANDS` (the README's command, what the test runs for it,
and why that differs, if it does), the ``ini`` block as /etc/pepsi.conf. The
README and the table must list the same commands in the same order, so a command
the README gains, loses or changes fails this test until the table learns it.

Paths, user names, the database and the ports are the README's own, not
translated: everything runs inside a private mount and network namespace
(``unshare``) where /etc, /opt, /usr/local and /srv are overlays on the real
directories (written to a temporary upper layer, never to the host),
/run/postgresql is the socket directory of a PostgreSQL cluster of the test's own
(peer authentication on the socket, scram-sha-256 on 127.0.0.1:5432, as Debian
sets it up), and 127.0.0.1 is the namespace's own loopback. So ``useradd pepsi``,
``createdb pepsi``, ``/etc/pepsi.conf`` (the file every tool finds by default),
``host=/run/postgresql`` and ``127.0.0.1:9187`` mean on this box what they mean on
a server, and nothing is left behind: the namespace, its users and the cluster go
when the test ends. (Paths moved to a temporary root would hide what the default
search finds: alice's ``pepsi-queue`` meets the service's /etc/pepsi.conf, which
she may not read.)

What the test box cannot do literally, :data:`COMMANDS` and :data:`SUDO` say:

* ``sudo -u X`` is ``runuser -u X --`` (sudo is not installed everywhere; root
  needs no sudoers entry for runuser);
* step 0 builds the wheel with the project's venv and ``--no-build-isolation``
  (offline: setuptools comes from the test extras, not from a download), in a copy
  of the repository's sources;
* step 1's ``pip install`` installs the wheel with ``--no-deps``: the wheel
  itself is installed by the venv's own pip, as written, and its dependencies come
  from this project's venv through a .pth line (not its editable pepsi_dispatch:
  nested .pth files are not processed); ``pip check`` then proves them met;
* ``systemctl enable --now UNIT`` runs the unit file the README installed (the
  one the wheel ships) as systemd would: ExecStartPre then ExecStart, with its
  EnvironmentFile=, as its User= (or, with DynamicUser=, a uid with no account),
  under ``setpriv`` with the unit's CapabilityBoundingSet= and NoNewPrivileges=,
  its UMask=, a clean environment and, for Type=notify, a NOTIFY_SOCKET it must
  answer with READY=1; stopping it is its KillSignal= to the main process.
  Sandboxing (ProtectSystem= and the like) and the restart policy are not
  emulated, and a unit key the emulation does not know fails the test;
* ``journalctl -p warning`` reads the unit's output, captured to a file (no
  journal here): it must hold no line at WARNING or worse;
* step 5's payload is a real image (the README elides its URL).

What the README takes for granted the test sets up first: PostgreSQL running,
the person ``alice`` (an account), and, with the ini block, the stage program
its PROGRAM names (as "Write a stage program" shows) and an image to resize.

Between commands the test waits and looks, as the administrator would: the
enqueued message must end ``done`` at ``upload``, having passed both stages of a
small SDK stage program run by the service user, before alice lists failures and
pauses ``upload``; pepsi-httpd must answer /healthz and /metrics.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from conftest import ROOT

from pepsi_dispatch.devtools import embedded

#: The sources a checkout builds its wheel from (as test_wheel.py copies them).
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

#: Directories overlaid in the namespace: the README writes to them.
OVERLAID = ("/etc", "/opt", "/usr/local", "/srv")
#: The environment the administrator's shell (and sudo) gives commands.
ADMIN_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
}
#: systemd's environment for a system service's processes (before the unit's own).
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

SAME = "<as written>"
SYSTEMCTL = "<the unit, as systemd would run it>"
JOURNAL = "<the unit's captured output>"

#: Applied to every command that runs: (README text, test text, why).
SUDO = (
    re.compile(r"\bsudo -u (\w+) "),
    r"runuser -u \1 -- ",
    "sudo may not be installed; runuser does the same for root without a sudoers entry",
)

IMAGE = "/srv/images/cat.ppm"

#: Every command of the README's Deploying section, in order: (the README's
#: command, comments dropped and continuation lines joined; what the test runs;
#: why it differs). SAME: run as written (after SUDO); SYSTEMCTL: the installed
#: unit, started as systemd would (see the module's docstring); JOURNAL: the
#: unit's captured output, read for what the command would show.
COMMANDS: list[tuple[str, str, str]] = [
    (
        "python3 -m pip wheel --no-deps -w dist .",
        f"{sys.executable} -m pip wheel -q --no-deps --no-build-isolation -w dist .",
        "offline: the build backend from the project's venv, not downloaded",
    ),
    ("/usr/bin/python3 -m venv /opt/pepsi", SAME, ""),
    (
        "/opt/pepsi/bin/pip install dist/pepsi_dispatch-0.1.0-py3-none-any.whl",
        "/opt/pepsi/bin/pip install -q --no-deps dist/pepsi_dispatch-0.1.0-py3-none-any.whl",
        "offline: the dependencies come from the project's venv (a .pth line), pip check"
        " then proves them met",
    ),
    (
        "ln -s /opt/pepsi/bin/pepsi-dispatch /opt/pepsi/bin/pepsi-queue"
        " /opt/pepsi/bin/pepsi-httpd /usr/local/bin/",
        SAME,
        "",
    ),
    ("mkdir -p /usr/local/share/man/man1 /usr/local/share/man/man5", SAME, ""),
    ("ln -s /opt/pepsi/share/man/man1/pepsi-*.1 /usr/local/share/man/man1/", SAME, ""),
    ("ln -s /opt/pepsi/share/man/man5/pepsi.conf.5 /usr/local/share/man/man5/", SAME, ""),
    (
        "useradd --system --home-dir /nonexistent --shell /usr/sbin/nologin pepsi",
        SAME,
        "",
    ),
    ("sudo -u pepsi /opt/pepsi/bin/pepsi-queue --help >/dev/null", SAME, ""),
    ("sudo -u postgres createdb pepsi", SAME, ""),
    (
        "sudo -u postgres env PEPSI_DSN=postgresql:///pepsi pepsi-queue migrate --sql | less",
        SAME,
        "",
    ),
    ("sudo -u postgres env PEPSI_DSN=postgresql:///pepsi pepsi-queue migrate", SAME, ""),
    (
        'sudo -u postgres psql pepsi -c "CREATE ROLE pepsi LOGIN IN ROLE pepsi_dispatcher"'
        " -c \"CREATE ROLE pepsi_worker LOGIN PASSWORD 'change-me' IN ROLE pepsi_stage\""
        ' -c "CREATE ROLE alice LOGIN IN ROLE pepsi_operator"'
        " -c \"CREATE ROLE pepsi_web LOGIN PASSWORD 'change-me' IN ROLE pepsi_dashboard\"",
        SAME,
        "",
    ),
    ("pepsi-dispatch -c /etc/pepsi.conf serve --check", SAME, ""),
    (
        "install -m 644 /opt/pepsi/share/pepsi-dispatch/systemd/pepsi-dispatch.service"
        " /etc/systemd/system/",
        SAME,
        "",
    ),
    (
        "systemctl daemon-reload && systemctl enable --now pepsi-dispatch",
        SYSTEMCTL,
        "no systemd here: the installed unit's Exec lines, credentials and capabilities",
    ),
    (
        "journalctl -u pepsi-dispatch -p warning",
        JOURNAL,
        "no journal here: the unit's output, captured to a file, is read instead (no line"
        " at WARNING or worse)",
    ),
    ("man pepsi-dispatch", SAME, ""),
    (
        "sudo -u alice env PEPSI_DSN=postgresql:///pepsi pepsi-queue enqueue resize"
        ' \'{"url": "…"}\'',
        "sudo -u alice env PEPSI_DSN=postgresql:///pepsi pepsi-queue enqueue resize"
        f' \'{{"url": "file://{IMAGE}"}}\'',
        "a real image for the elided URL",
    ),
    (
        "sudo -u alice env PEPSI_DSN=postgresql:///pepsi pepsi-queue list --status failed",
        SAME,
        "",
    ),
    ("sudo -u alice env PEPSI_DSN=postgresql:///pepsi pepsi-queue pause upload", SAME, ""),
    (
        "echo 'PEPSI_DSN=postgresql://pepsi_web:change-me@127.0.0.1:5432/pepsi'"
        " > /etc/pepsi-httpd.env",
        SAME,
        "",
    ),
    ("chmod 600 /etc/pepsi-httpd.env", SAME, ""),
    (
        "install -m 644 /opt/pepsi/share/pepsi-dispatch/systemd/pepsi-httpd.service"
        " /etc/systemd/system/",
        SAME,
        "",
    ),
    (
        "systemctl daemon-reload && systemctl enable --now pepsi-httpd",
        SYSTEMCTL,
        "no systemd here: the installed unit's Exec lines, credentials and capabilities",
    ),
]

#: The ini block's own instructions (in its comment): where it goes, and its owner
#: and mode; the test follows them.
CONF_FILE = "/etc/pepsi.conf"
CONF_OWNER = "chown root:pepsi"
CONF_MODE = "chmod 0640"

#: The README's stage program ("Write a stage program"), for its [stage-*] PROGRAM:
#: resize reads the image's size, upload finishes; both note who ran them.
STAGE_PROGRAM = '''#!/opt/pepsi/bin/python
"""resize, then upload (the README's pipeline)."""
import os

from pepsi_dispatch.worker import Advance, Fail, Finish, Message, run


def resize(msg: Message):
    url = msg.payload.get("url", "")
    if not url.startswith("file://"):
        return Fail(f"cannot fetch {url}")
    with open(url[len("file://"):], "rb") as image:
        _, width, height, _ = image.readline().split()
    msg.state["resized"] = f"{int(width) // 2}x{int(height) // 2}"
    msg.state["resize_uid"] = os.getuid()
    return Advance("upload")


def upload(msg: Message):
    msg.state["upload_uid"] = os.getuid()
    return Finish()


run({"resize": resize, "upload": upload})
'''

#: Unit keys the emulation honours, and those it knowingly leaves to systemd.
UNIT_HONOURED = {
    "Type",
    "NotifyAccess",
    "ExecStartPre",
    "ExecStart",
    "EnvironmentFile",
    "Environment",
    "User",
    "Group",
    "DynamicUser",
    "CapabilityBoundingSet",
    "NoNewPrivileges",
    "UMask",
    "WatchdogSec",
    "KillMode",
    "KillSignal",
    "TimeoutStopSec",
    "StandardOutput",
    "StandardError",
}
UNIT_NOT_EMULATED = {  # sandboxing, restarts, reloads and the journal's name: systemd's
    "ExecReload",
    "Restart",
    "RestartSec",
    "RestartPreventExitStatus",
    "SyslogIdentifier",
    "LogsDirectory",
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "PrivateDevices",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectClock",
    "ProtectHostname",
    "RestrictSUIDSGID",
    "RestrictRealtime",
    "RestrictNamespaces",
    "LockPersonality",
    "MemoryDenyWriteExecute",
    "RestrictAddressFamilies",
    "SystemCallArchitectures",
}
CAP_SETGID, CAP_SETUID = 6, 7

missing = [
    t for t in ("setpriv", "useradd", "unshare", "nsenter", "runuser") if not shutil.which(t)
]
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: useradd, setpriv, namespaces"),
    pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)} (util-linux, passwd)"),
]


# --------------------------------------------------------------------------- the README


@dataclass
class Block:
    """A fenced block of the Deploying section: its language, comment and commands."""

    lang: str
    text: str
    commands: list[str] = field(default_factory=list)
    comment: str = ""


def _strip_comment(line: str) -> str:
    """``line`` without its shell comment (a ``#`` starting a word outside quotes)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def deploying_blocks(readme: str) -> list[Block]:
    """The fenced blocks of ``## Deploying``; sh blocks split into their commands."""
    section = readme.split("\n## Deploying\n", 1)[1].split("\n## ", 1)[0]
    blocks = []
    for lang, text in re.findall(r"^```(\w+)\n(.*?)^```$", section, re.M | re.S):
        block = Block(lang, text)
        block.comment = " ".join(
            line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#")
        )
        if lang == "sh":
            pending = ""
            for raw in text.splitlines():
                line = _strip_comment(raw)
                if line.endswith("\\"):
                    pending += line[:-1].strip() + " "
                    continue
                line = (pending + line.strip()).strip()
                pending = ""
                if line:
                    block.commands.append(line)
        blocks.append(block)
    return blocks


def test_the_table_knows_every_readme_command() -> None:
    """README and :data:`COMMANDS` list the same commands: neither drifts silently."""
    blocks = deploying_blocks((ROOT / "README.md").read_text())
    assert [b.lang for b in blocks] == ["sh", "ini", "sh"], [b.lang for b in blocks]
    readme = [c for b in blocks for c in b.commands]
    table = [c for c, _, _ in COMMANDS]
    assert readme == table, "README's Deploying commands changed: update COMMANDS\n" + "\n".join(
        f"{'README' if c in readme else 'table '}: {c}"
        for c in [*readme, *table]
        if (c in readme) != (c in table)
    )
    ini = blocks[1]
    for instruction in (CONF_FILE, CONF_OWNER, CONF_MODE):
        assert instruction in ini.comment, (instruction, ini.comment)
    for readme_cmd, test_cmd, why in COMMANDS:
        assert (test_cmd == SAME) == (not why), (readme_cmd, "a changed command says why")


# --------------------------------------------------------------------------- the namespace


class Namespace:
    """A private mount + network namespace with overlays on :data:`OVERLAID` and a
    PostgreSQL cluster of its own on /run/postgresql and 127.0.0.1:5432."""

    def __init__(self, top: Path) -> None:
        self.top = top
        self.pgdata = top / "pg" / "data"
        self.pgrun = top / "pgrun"  # /run/postgresql inside
        self.bindir = embedded.find_bindir()
        self.procs: list[subprocess.Popen[bytes]] = []
        mounts = ["ip link set lo up"]
        for i, path in enumerate(OVERLAID):
            upper, work = top / "overlay" / str(i) / "upper", top / "overlay" / str(i) / "work"
            upper.mkdir(parents=True)
            work.mkdir()
            mounts.append(
                f"mount -t overlay overlay -o lowerdir={path},upperdir={upper},workdir={work}"
                f" {path}"
            )
        self.pgrun.mkdir()
        shutil.chown(self.pgrun, "postgres", "postgres")
        self.pgrun.chmod(0o2775)
        mounts.append(f"mount --bind {self.pgrun} /run/postgresql")
        # Without a /run/postgresql of the host's, a private /run holds the mount point.
        private_run = (
            "[ -d /run/postgresql ] || { mount -t tmpfs tmpfs /run; mkdir /run/postgresql; }"
        )
        script = "\n".join(["set -e", private_run, *mounts, "echo ready", "exec cat"])
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--net", "--propagation", "private", "/bin/sh", "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.holder.stdout is not None
        if self.holder.stdout.readline() != b"ready\n":
            err = self.holder.communicate(timeout=10)[1].decode()
            if "Operation not permitted" in err:
                pytest.skip(f"no mount namespaces here (CAP_SYS_ADMIN): {err.strip()}")
            raise AssertionError(f"namespace set-up failed: {err}")
        self.mnt = os.readlink(f"/proc/{self.holder.pid}/ns/mnt")

    def enter(self, cwd: str = "/") -> list[str]:
        """The prefix of a command run inside, in ``cwd``."""
        return ["nsenter", "-t", str(self.holder.pid), "-m", "-n", f"--wd={cwd}", "--"]

    def sh(
        self, command: str, cwd: str = "/", input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` with /bin/sh inside, as root, in the administrator's environment."""
        r = subprocess.run(
            [*self.enter(cwd), "/bin/sh", "-c", command],
            env=ADMIN_ENV,
            input=input,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if check:
            assert r.returncode == 0, f"$ {command}\n-> {r.returncode}\n{r.stdout}\n{r.stderr}"
        return r

    def read(self, path: str) -> str:
        """A file's text as seen inside."""
        return self.sh(f"cat {shlex.quote(path)}").stdout

    def start_postgres(self) -> None:
        """Debian's authentication: peer on the socket (root may be postgres), scram on TCP."""
        self.pgdata.parent.mkdir()
        shutil.chown(self.pgdata.parent, "postgres", "postgres")
        as_pg = ["runuser", "-u", "postgres", "--"]
        subprocess.run(
            [*as_pg, str(self.bindir / "initdb"), "-D", str(self.pgdata), "-U", "postgres"]
            + ["-E", "UTF8", "--no-locale", "--no-sync", "--auth=peer"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        (self.pgdata / "pg_hba.conf").write_text(
            "local all postgres peer map=admin\n"
            "local all all peer\n"
            "host all all 127.0.0.1/32 scram-sha-256\n"
        )
        (self.pgdata / "pg_ident.conf").write_text("admin postgres postgres\nadmin root postgres\n")
        options = (
            "-c listen_addresses=127.0.0.1 -p 5432 -c unix_socket_directories=/run/postgresql"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        r = subprocess.run(
            [*self.enter(), *as_pg, str(self.bindir / "pg_ctl"), "-D", str(self.pgdata)]
            + ["-l", str(self.pgdata.parent / "log"), "-w", "-o", options, "start"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stdout + r.stderr

    def superuser(self, dbname: str = "pepsi") -> psycopg.Connection:
        """The test's own connection (from outside, through the socket's real path)."""
        return psycopg.connect(
            host=str(self.pgrun), port=5432, user="postgres", dbname=dbname, autocommit=True
        )

    def members(self) -> list[int]:
        """The pids of every process in the namespace (all of them this test's)."""
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != self.holder.pid:
                try:
                    if os.readlink(f"/proc/{entry}/ns/mnt") == self.mnt:
                        pids.append(int(entry))
                except OSError:
                    continue
        return pids

    def close(self) -> None:
        """Stop what runs inside (units, PostgreSQL, strays), then the namespace."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
        if (self.pgdata / "postmaster.pid").exists():
            subprocess.run(
                [*self.enter(), "runuser", "-u", "postgres", "--"]
                + [str(self.bindir / "pg_ctl"), "-D", str(self.pgdata), "-m", "immediate", "stop"],
                capture_output=True,
                timeout=60,
            )
        for pid in self.members():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.holder.stdin:
            self.holder.stdin.close()
        self.holder.wait(30)


def uids(pid: int) -> tuple[list[int], int, int]:
    """A process's real/effective/saved/fs uids, effective and bounding capabilities."""
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return (
        [int(u) for u in status["Uid"].split()],
        int(status["CapEff"], 16),
        int(status["CapBnd"], 16),
    )


def owner(pid: int) -> int | None:
    """The uid a process runs as (None once it is gone)."""
    try:
        return Path(f"/proc/{pid}").stat().st_uid
    except FileNotFoundError:
        return None


def wait_for(
    what: str | Callable[[], str], probe: Callable[[], object], timeout: float = 60
) -> object:
    """Poll ``probe`` until it returns something true, or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, (
            f"timed out waiting for {what if isinstance(what, str) else what()}"
        )
        time.sleep(0.1)


# --------------------------------------------------------------------------- systemd


@dataclass
class Service:
    """A unit's started main process, its output file and how to stop it."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    kill_signal: int
    stop_timeout: float
    notify: socket.socket | None  # Type=notify: the NOTIFY_SOCKET, open while it runs

    def output(self) -> str:
        """What the unit wrote (the journal's part)."""
        return self.log.read_text(errors="replace")

    def warnings(self) -> list[str]:
        """``journalctl -u UNIT -p warning``: its lines at WARNING or worse."""
        return [
            x for x in self.output().splitlines() if re.search(r" (WARNING|ERROR|CRITICAL) ", x)
        ]

    def stop(self) -> int:
        """systemctl stop: KillSignal= to the main process, then its exit status; a
        Type=notify service must have said STOPPING=1."""
        self.proc.send_signal(self.kill_signal)
        status = self.proc.wait(self.stop_timeout)
        if self.notify is not None:
            with self.notify:
                self.notify.setblocking(False)
                said = []
                while True:
                    try:
                        said += self.notify.recv(4096).decode().split("\n")
                    except BlockingIOError:
                        break
            assert "STOPPING=1" in said, said
        return status


def parse_unit(text: str) -> dict[str, list[str]]:
    """The [Service] section of a unit file: key -> its values, in order."""
    service: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line
            continue
        key, _, value = line.partition("=")
        if section == "[Service]":
            service.setdefault(key.strip(), []).append(value.strip())
    unknown = set(service) - UNIT_HONOURED - UNIT_NOT_EMULATED
    assert not unknown, f"the unit has keys this test does not emulate: {sorted(unknown)}"
    return service


def environment_file(text: str) -> dict[str, str]:
    """systemd's EnvironmentFile= format (KEY=VALUE lines, # comments, quotes)."""
    env = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line and line[0] not in "#;":
            key, _, value = line.partition("=")
            env[key.strip()] = " ".join(shlex.split(value)) if value.strip() else ""
    return env


def bounding_set(value: str) -> str:
    """CapabilityBoundingSet= as setpriv's --bounding-set."""
    caps = [c.lower().removeprefix("cap_") for c in value.split()]
    return ",".join(["-all", *(f"+{c}" for c in caps)])


def systemctl_start(ns: Namespace, unit_name: str) -> tuple[Service, dict[str, list[str]]]:
    """``systemctl enable --now UNIT``: the installed unit's ExecStartPre, then its
    ExecStart, with its credentials, capabilities, environment and umask."""
    unit = parse_unit(ns.read(f"/etc/systemd/system/{unit_name}.service"))
    one = {k: v[-1] for k, v in unit.items()}
    setpriv = [
        "setpriv",
        "--inh-caps",
        "-all",
        "--bounding-set",
        bounding_set(one.get("CapabilityBoundingSet", "")),
    ]
    env = {"PATH": SYSTEMD_PATH}
    if one.get("User"):
        setpriv += ["--reuid", one["User"], "--regid", one.get("Group", one["User"])]
        setpriv += ["--init-groups"]
        env.update(USER=one["User"], LOGNAME=one["User"])
    elif one.get("DynamicUser") == "yes":
        taken = {line.split(":")[2] for line in ns.read("/etc/passwd").splitlines()}
        uid = next(str(u) for u in range(61184, 65520) if str(u) not in taken)
        setpriv += ["--reuid", uid, "--regid", uid, "--clear-groups"]
    if one.get("NoNewPrivileges") == "yes":
        setpriv.append("--no-new-privs")
    for path in unit.get("EnvironmentFile", []):
        optional = path.startswith("-")
        r = ns.sh(f"cat {shlex.quote(path.lstrip('-'))}", check=not optional)
        env.update(environment_file(r.stdout if r.returncode == 0 else ""))
    for assignments in unit.get("Environment", []):
        env.update(a.split("=", 1) for a in shlex.split(assignments))
    umask = int(one.get("UMask", "0022"), 8)

    def command(line: str) -> list[str]:
        argv = shlex.split(line)
        assert argv[0].startswith("/"), f"a prefix or relative path this test cannot run: {line}"
        return [*ns.enter(), *setpriv, "--", *argv]

    for pre in unit.get("ExecStartPre", []):
        r = subprocess.run(
            command(pre), env=env, umask=umask, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, f"{unit_name} ExecStartPre={pre}\n{r.stdout}{r.stderr}"

    notify = None
    if one.get("Type", "simple") == "notify":
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        address = ns.top / f"{unit_name}.notify"
        notify.bind(str(address))
        address.chmod(0o777)
        notify.settimeout(0.2)
        env["NOTIFY_SOCKET"] = str(address)
        if "WatchdogSec" in one:
            env["WATCHDOG_USEC"] = str(int(one["WatchdogSec"]) * 1_000_000)
    log = ns.top / f"{unit_name}.journal"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command(one["ExecStart"]),
            env=env,
            umask=umask,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    ns.procs.append(proc)
    service = Service(
        unit_name,
        proc,
        log,
        signal.Signals[one.get("KillSignal", "SIGTERM")],
        float(one.get("TimeoutStopSec", "90")),
        notify,
    )
    if notify is not None:
        wait_for(
            lambda: f"{unit_name}: READY=1\n{service.output()}", lambda: _ready(notify, proc), 90
        )
    return service, unit


def _ready(sock: socket.socket, proc: subprocess.Popen[bytes]) -> bool:
    assert proc.poll() is None, f"exited {proc.returncode} before READY=1"
    try:
        return "READY=1" in sock.recv(4096).decode().split("\n")
    except TimeoutError:
        return False


# --------------------------------------------------------------------------- the test


@pytest.fixture
def ns() -> Iterator[Namespace]:
    """The namespace of :class:`Namespace` in a fresh temporary directory."""
    top = Path(tempfile.mkdtemp(prefix="pepsi-readme-", dir="/tmp"))
    top.chmod(0o755)  # the service user reaches the notify socket; postgres its files
    namespace = None
    try:
        namespace = Namespace(top)
        yield namespace
    finally:
        if namespace is not None:
            namespace.close()
        shutil.rmtree(top, ignore_errors=True)


def _sources(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_data")
    dest.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, dest / name, ignore=ignore)
        elif path.exists():
            shutil.copy2(path, dest / name)


def _ppm(width: int, height: int) -> bytes:
    return f"P6 {width} {height} 255\n".encode() + bytes(3 * width * height)


class Administrator:
    """Follows the README inside the namespace, one command of :data:`COMMANDS` at a
    time, and looks at the result where the README says what should happen."""

    def __init__(self, ns: Namespace) -> None:
        self.ns = ns
        self.src = ns.top / "src"  # "in the repository": a copy of its sources
        self.server = ns.top / "server"  # a directory on the server, with dist/ only
        self.services: dict[str, Service] = {}
        self.pepsi_uid = -1

    def run(self, readme_cmd: str, test_cmd: str) -> None:
        """One command of the README, as the table says; then what follows it."""
        if test_cmd == JOURNAL:
            unit = readme_cmd.split()[2]
            assert readme_cmd.endswith("-p warning"), readme_cmd
            assert not self.services[unit].warnings(), self.services[unit].output()
            return
        if test_cmd == SYSTEMCTL:
            name = readme_cmd.rsplit(" ", 1)[1]
            self.services[name], _ = systemctl_start(self.ns, name)
            getattr(self, f"_started_{name.replace('-', '_')}")()
            return
        command = SUDO[0].sub(SUDO[1], readme_cmd if test_cmd == SAME else test_cmd)
        in_repo = readme_cmd.startswith("python3 -m pip wheel")
        r = self.ns.sh(command, cwd=str(self.src if in_repo else self.server))
        after = next((f for tail, f in AFTER.items() if readme_cmd.endswith(tail)), None)
        if in_repo:  # the wheel travels to the server
            shutil.copytree(self.src / "dist", self.server / "dist")
        if readme_cmd.startswith("/opt/pepsi/bin/pip install"):
            self._dependencies()
        if readme_cmd.startswith("useradd"):
            self.pepsi_uid = int(self.ns.sh("id -u pepsi").stdout)
        if after:
            after(self, r)

    def _dependencies(self) -> None:
        """The wheel's dependencies from the project's venv (offline); pip check."""
        site = self.ns.sh(
            "/opt/pepsi/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'"
        ).stdout.strip()
        deps = sysconfig.get_paths()["purelib"]
        self.ns.sh(f"echo {shlex.quote(deps)} > {site}/pepsi-test-deps.pth")
        self.ns.sh("/opt/pepsi/bin/pip check")
        where = self.ns.sh(
            "runuser -u nobody -- /opt/pepsi/bin/python -c"
            " 'import pepsi_dispatch.schema.resources as r; print(r.__file__, r.data_root())'"
        ).stdout
        assert where.startswith("/opt/pepsi/lib/") and "pepsi_dispatch/_data" in where, where

    def write_conf(self, block: Block) -> None:
        """The ini block as /etc/pepsi.conf, owned and moded as its comment says; the
        stage program it names, as "Write a stage program" shows; an image for step 5."""
        body = block.text[block.text.index("\n[") + 1 :]
        self.ns.sh(f"cat > {CONF_FILE}", input=body)
        self.ns.sh(f"{CONF_OWNER} {CONF_FILE} && {CONF_MODE} {CONF_FILE}")
        programs = set(re.findall(r"^PROGRAM = (\S+)", body, re.M))
        assert programs == {"/opt/pepsi/stages/images.py"}, programs
        for program in programs:
            self.ns.sh(f"mkdir -p {Path(program).parent} && cat > {program}", input=STAGE_PROGRAM)
            self.ns.sh(f"chmod 755 {program}")
        self.ns.sh(f"mkdir -p {Path(IMAGE).parent}")
        (self.ns.top / "cat.ppm").write_bytes(_ppm(640, 480))
        self.ns.sh(f"install -m 644 {self.ns.top / 'cat.ppm'} {IMAGE}")

    def _started_pepsi_dispatch(self) -> None:
        """The dispatcher runs as pepsi with no capability left but the bounding set's."""
        d = self.services["pepsi-dispatch"]
        ids, eff, bnd = uids(d.proc.pid)
        assert ids == [self.pepsi_uid] * 4, (ids, d.output())
        assert eff == 0 and bnd == (1 << CAP_SETUID) | (1 << CAP_SETGID), (hex(eff), hex(bnd))

    def _started_pepsi_httpd(self) -> None:
        """pepsi-httpd answers /healthz (a live dispatcher) and /metrics on its port."""
        h = self.services["pepsi-httpd"]

        def get(path: str) -> subprocess.CompletedProcess[str]:
            assert h.proc.poll() is None, h.output()
            return self.ns.sh(f"curl -fsS http://127.0.0.1:9187{path}", check=False)

        health = wait_for("/healthz", lambda: (r := get("/healthz")).returncode == 0 and r, 60)
        assert isinstance(health, subprocess.CompletedProcess)
        assert health.stdout.startswith("ok"), health.stdout  # 200: a live dispatcher
        metrics = get("/metrics").stdout
        assert "pepsi_database_up 1.0" in metrics, metrics[:2000]
        assert 'pepsi_stage_paused{stage="upload"} 1.0' in metrics, metrics[:2000]
        ids, eff, bnd = uids(h.proc.pid)
        assert ids[0] >= 61184 and len(set(ids)) == 1 and eff == bnd == 0, (ids, eff, bnd)


def _checked(_: Administrator, r: subprocess.CompletedProcess[str]) -> None:
    assert "all" in r.stdout.splitlines()[-1] and "checks passed" in r.stdout, r.stdout
    assert "ok   service user: running as pepsi" in r.stdout, r.stdout


def _schema_sql(_: Administrator, r: subprocess.CompletedProcess[str]) -> None:
    assert "CREATE TABLE pepsi.workqueue" in r.stdout, r.stdout[:2000]


def _enqueued(admin: Administrator, r: subprocess.CompletedProcess[str]) -> None:
    """The message passes resize and upload, both run by the service user."""
    with admin.ns.superuser() as conn:

        def finished() -> tuple[object, ...] | None:
            row = conn.execute("SELECT status, stage, state FROM pepsi.messages").fetchone()
            return row if row and row[0] not in ("pending", "running") else None

        row = wait_for("the message to finish", finished, 60)
    d = admin.services["pepsi-dispatch"]
    assert isinstance(row, tuple) and row[:2] == ("done", "upload"), (row, d.output()[-3000:])
    state = row[2]
    assert state["resized"] == "320x240", state
    assert state["resize_uid"] == state["upload_uid"] == admin.pepsi_uid, state


def _listed(_: Administrator, r: subprocess.CompletedProcess[str]) -> None:
    assert r.stdout == "no messages match\n" and not r.stderr, r.stdout + r.stderr


def _paused(_: Administrator, r: subprocess.CompletedProcess[str]) -> None:
    assert r.stdout.startswith("paused stage upload"), r.stdout


def _man(_: Administrator, r: subprocess.CompletedProcess[str]) -> None:
    assert "pepsi-dispatch" in r.stdout and "SERVICE_USER" in r.stdout, r.stdout[:2000]


#: What the administrator looks at after a command (by the command's tail).
AFTER: dict[str, Callable[[Administrator, subprocess.CompletedProcess[str]], None]] = {
    "serve --check": _checked,
    "migrate --sql | less": _schema_sql,
    'enqueue resize \'{"url": "…"}\'': _enqueued,
    "list --status failed": _listed,
    "pause upload": _paused,
    "man pepsi-dispatch": _man,
}


def test_readme_deploy_steps_start_the_dispatcher_and_httpd_as_the_service_user(
    ns: Namespace,
) -> None:
    """Steps 0-6 of the README, as written (through :data:`COMMANDS`), start the
    dispatcher and pepsi-httpd from their units under the units' capability sets."""
    blocks = deploying_blocks((ROOT / "README.md").read_text())
    assert [c for b in blocks for c in b.commands] == [c for c, _, _ in COMMANDS]
    admin = Administrator(ns)
    _sources(admin.src)
    admin.server.mkdir()
    ns.start_postgres()
    ns.sh("useradd --no-create-home --home-dir /nonexistent alice")  # a person, README's "alice"

    table = iter(COMMANDS)
    for block in blocks:
        if block.lang == "ini":
            admin.write_conf(block)
        for command in block.commands:
            readme_cmd, test_cmd, _ = next(table)
            assert readme_cmd == command
            admin.run(readme_cmd, test_cmd)

    for name in ("pepsi-httpd", "pepsi-dispatch"):
        service = admin.services[name]
        assert service.stop() in (0, -signal.SIGTERM), service.output()[-3000:]
        assert "Traceback" not in service.output() and not service.warnings(), service.output()[
            -3000:
        ]
    left = [p for p in ns.members() if owner(p) == admin.pepsi_uid]
    assert not left, f"processes of pepsi outlived the dispatcher: {left}"
