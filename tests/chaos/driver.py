"""The chaos soak: a 3-stage pipeline under random faults, then the history checker.

    python tests/chaos/driver.py [--mode single|competing|both] [--seconds N] [--seed S]
                                 [--faults a,b,...] [--keep]

Environment: ``CHAOS_SECONDS`` (default 300, per mode), ``CHAOS_SEED`` (default:
random, printed at the start; give it back to replay the same fault schedule),
``CHAOS_MODE``, ``CHAOS_FAULTS`` (comma-separated subset of FAULTS).

What runs:

- a throwaway PostgreSQL cluster of its own (system binaries, as
  pepsi_dispatch.devtools.embedded does), listening on a Unix socket for the soak's own
  connections and on a TCP port of 127.0.0.1 for the dispatchers and workers,
  which reach it through a black-hole proxy per dispatcher (tests/chaos/proxy.py);
- a trigger on pepsi.workqueue recording every committed status/stage change,
  and one on pepsi.dispatchers recording who was deleted by reset_orphans (that
  dispatcher was declared dead);
- one dispatcher (single mode) or three (competing mode, small ORPHAN_TIMEOUT),
  restarted after any exit like a service manager would; a SIGKILL of a
  dispatcher is followed by a SIGKILL of its whole process tree (what systemd
  does with KillMode=control-group or mixed: a SIGKILLed dispatcher cannot clean
  up after itself);
- stages: ``a`` (stage_a.py: the pipe protocol by hand, raw psycopg), ``b``
  (wrapper.sh forking one.sh per message, psql), ``c`` (stage_c.py, the SDK);
- a load thread enqueuing into ``a``; a watcher recording when each stage
  program was last seen alive;
- faults at random moments from a seeded RNG (see FAULTS).

Then: faults stop, the queue drains, every dispatcher stops cleanly, a
fault-free tail of messages runs between two clean stops (exact stats check),
and checker.check() gives the verdict. Exit 0 when it holds, 1 when not.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import checker  # noqa: E402
from proxy import BlackHoleProxy  # noqa: E402

from pepsi_dispatch.devtools import embedded  # noqa: E402

VENV_BIN = ROOT / ".venv" / "bin"
DISPATCH = VENV_BIN / "pepsi-dispatch"

FAULTS = [
    "kill9_dispatcher",
    "kill9_worker",
    "kill9_child",
    "sigstop_dispatcher",  # competing mode only
    "terminate_dispatcher_conns",
    "terminate_worker_conns",
    "pg_restart",
    "partition",
    "reload_file",
    "reload_overlay",
    "bad_reload",
    "sigterm_restart",
]

ORPHAN_TIMEOUT = 4.0
SHUTDOWN_TIMEOUT = 3.0
POLL_INTERVAL = 1.0

HISTORY_SQL = """
CREATE TABLE IF NOT EXISTS public.chaos_history (
    n bigserial PRIMARY KEY, id bigint, old_stage text, new_stage text,
    old_status text, new_status text, old_did bigint, new_did bigint, t double precision);
CREATE TABLE IF NOT EXISTS public.chaos_deleted (
    did bigint, t double precision, query text);
CREATE OR REPLACE FUNCTION public.chaos_history_row() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status IS DISTINCT FROM NEW.status OR OLD.stage IS DISTINCT FROM NEW.stage THEN
        INSERT INTO public.chaos_history
            (id, old_stage, new_stage, old_status, new_status, old_did, new_did, t)
        VALUES (NEW.workqueue_id, OLD.stage, NEW.stage, OLD.status, NEW.status,
                OLD.dispatcher_id, NEW.dispatcher_id, extract(epoch FROM clock_timestamp()));
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION public.chaos_deleted_row() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.chaos_deleted VALUES
        (OLD.dispatcher_id, extract(epoch FROM clock_timestamp()), current_query());
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS chaos_history ON pepsi.workqueue;
CREATE TRIGGER chaos_history AFTER UPDATE ON pepsi.workqueue
    FOR EACH ROW EXECUTE FUNCTION public.chaos_history_row();
DROP TRIGGER IF EXISTS chaos_deleted ON pepsi.dispatchers;
CREATE TRIGGER chaos_deleted AFTER DELETE ON pepsi.dispatchers
    FOR EACH ROW EXECUTE FUNCTION public.chaos_deleted_row();
"""


def say(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ cluster


class Cluster:
    """A PostgreSQL cluster of the soak's own: Unix socket + TCP on 127.0.0.1."""

    def __init__(self, base: Path, port: int | None = None, fast: bool = True) -> None:
        self.bindir = embedded.find_bindir()
        self.home = embedded.cluster_home(base)
        embedded._chown_for_server(self.home)
        self.data = self.home / "data"
        self.run = self.home / "run"
        self.logfile = self.home / "postgres.log"
        self.port = port or free_port()
        self.as_pg = embedded._as_server_user()
        self.fast = fast

    def initdb(self) -> None:
        embedded._run(
            [
                *self.as_pg,
                str(self.bindir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
            "initdb",
        )

    def options(self) -> str:
        opts = f"-k {self.run} -c listen_addresses=127.0.0.1 -p {self.port} -c max_connections=200"
        if self.fast:
            opts += " -c fsync=off -c full_page_writes=off"
        return opts

    def pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [*self.as_pg, str(self.bindir / "pg_ctl"), "-D", str(self.data), *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {r.stdout}{r.stderr}")
        return r

    def start(self) -> None:
        self.run.mkdir(exist_ok=True)
        embedded._chown_for_server(self.run)
        self.pg_ctl("-l", str(self.logfile), "-o", self.options(), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast", check: bool = True) -> None:
        self.pg_ctl("-m", mode, "-w", "-t", "60", "stop", check=check)

    def unix_dsn(self, dbname: str) -> str:
        return f"postgresql:///{dbname}?host={self.run}&port={self.port}&user=postgres"

    def tcp_dsn(self, dbname: str, port: int | None = None) -> str:
        return f"postgresql://postgres@127.0.0.1:{port or self.port}/{dbname}?connect_timeout=5"


def migrate(dsn: str) -> None:
    r = subprocess.run(
        [str(VENV_BIN / "alembic"), "upgrade", "head"],
        cwd=ROOT,
        env={**os.environ, "PEPSI_DSN": dsn},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if r.returncode != 0:
        raise RuntimeError(f"alembic upgrade head failed:\n{r.stdout}{r.stderr}")


# ------------------------------------------------------------------ processes


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, starttime) of pid, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rindex(")") + 2 :].split()
    return rest[0], int(rest[1]), int(rest[19])


def children_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st and st[0] != "Z":
                out[st[1]].append(int(name))
    return out


def descendants(pid: int, cmap: dict[int, list[int]] | None = None) -> list[int]:
    cmap = cmap if cmap is not None else children_map()
    out, todo = [], list(cmap.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(cmap.get(p, []))
    return out


def is_sentinel(pid: int) -> bool:
    """A dispatcher's group sentinel (coordinator/workers/sentinel.py), not a worker."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "pepsi-sentinel"
    except OSError:
        return False


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class Watcher(threading.Thread):
    """Polls /proc for every stage program that logged something: last time seen alive."""

    def __init__(self, logdir: Path) -> None:
        super().__init__(daemon=True, name="watcher")
        self.logdir = logdir
        # Keyed by log file ("STAGE-PID-STARTTIME"), not pid: pids are reused in a long
        # soak, and a later process with the same pid must not look like this one alive.
        self.tracked: dict[str, tuple[int, int]] = {}  # file -> (pid, starttime)
        self.alive_at: dict[str, float] = {}
        self.dead: dict[str, float] = {}
        self.stop_flag = threading.Event()

    def run(self) -> None:
        seen_files: set[str] = set()
        while not self.stop_flag.is_set():
            now = time.time()
            for name in os.listdir(self.logdir):
                if name in seen_files:
                    continue
                seen_files.add(name)
                key = name.removesuffix(".jsonl")
                parts = key.rsplit("-", 2)
                pid = int(parts[-2]) if len(parts) == 3 else int(parts[-1])
                st = proc_stat(pid)
                # STAGE-PID-STARTTIME; a program that logs as STAGE-PID is taken
                # to be the process that has that pid now.
                start = int(parts[-1]) if len(parts) == 3 else (st[2] if st else -1)
                if st is None or st[0] == "Z" or st[2] != start:
                    mtime = (self.logdir / name).stat().st_mtime
                    self.dead[key] = mtime
                else:
                    self.tracked[key] = (pid, start)
                    self.alive_at[key] = now
            for key, (pid, start) in list(self.tracked.items()):
                st = proc_stat(pid)
                if st is None or st[0] == "Z" or st[2] != start:
                    self.dead[key] = self.alive_at[key]
                    del self.tracked[key]
                else:
                    self.alive_at[key] = now
            time.sleep(0.05)


class Replica:
    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.proc: subprocess.Popen | None = None
        self.stopped_until = 0.0  # SIGSTOPped until (time.time())
        self.restart_at = 0.0
        self.exits: list[int] = []
        self.starts = 0
        self.expect_exit = False
        self.started_bad = False  # started while a bad_reload's config was in place


def catches(pid: int, sig: int) -> bool:
    """True if process `pid` has a handler for `sig` (SigCgt in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except OSError:
        pass
    return False


# ------------------------------------------------------------------ the soak


class Soak:
    def __init__(self, mode: str, seconds: float, seed: int, faults: list[str], base: Path):
        self.mode = mode
        self.seconds = seconds
        self.seed = seed
        self.rng = random.Random(f"{seed}-{mode}")
        self.faults = [f for f in faults if mode == "competing" or f != "sigstop_dispatcher"]
        self.base = base
        self.logdir = base / "log"
        self.logdir.mkdir(parents=True)
        os.chmod(self.logdir, 0o777)
        self.conf = base / "pepsi.conf"
        self.cluster = Cluster(base / "pg")
        self.dbname = "chaos"
        self.replicas = [Replica(i) for i in range(3 if mode == "competing" else 1)]
        self.proxies: list[BlackHoleProxy] = []
        self.kills: list[tuple[int, float]] = []
        self.table: dict[str, Counter] = defaultdict(Counter)
        self.enqueued: list[int] = []
        self.enqueue_on = threading.Event()
        self.stop_all = threading.Event()
        self.pending_actions: list[tuple[float, str, object]] = []
        #: a bad_reload's bad file or overlay is in place: a dispatcher (re)started
        #: meanwhile exits 2 by contract (configuration error at start-up).
        self.conf_bad = False
        self.overlay_bad = False
        self.parallelism = {"a": 2, "b": 3, "c": 2}
        self.notes: list[str] = []
        self.extra: list[checker.Violation] = []  # liveness failures seen by the driver

    # ---- set-up
    def write_conf(self, bad: bool = False) -> None:
        p = self.parallelism
        competing = "YES" if self.mode == "competing" else "NO"
        text = f"""[pepsi-dispatch]
SERVICE_USER = root
CONFIG_FILE = {self.conf}
MAX_RUNTIME = 20 s
WORKER_IDLE_TIMEOUT = 2 s
POLL_INTERVAL = {POLL_INTERVAL:g} s
STATS_INTERVAL = 2 s
SHUTDOWN_TIMEOUT = {SHUTDOWN_TIMEOUT:g} s
COMPETING = {competing}
ORPHAN_TIMEOUT = {ORPHAN_TIMEOUT:g} s
RETENTION = 0

[stage-a]
PROGRAM = {HERE / "stage_a.py"}
NEXT = {"nosuch" if bad else "b"}
PARALLELISM = {p["a"]}
QUEUE_LIMIT = 2
MAX_RETRIES = 3

[stage-b]
PROGRAM = {HERE / "wrapper.sh"}
NEXT = c
PARALLELISM = {p["b"]}
QUEUE_LIMIT = 2

[stage-c]
PROGRAM = {HERE / "stage_c.py"}
PARALLELISM = {p["c"]}
QUEUE_LIMIT = 2
"""
        tmp = self.conf.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.conf)
        self.conf_bad = bad

    def setup(self) -> None:
        self.cluster.initdb()
        self.cluster.start()
        with psycopg.connect(self.cluster.unix_dsn("postgres"), autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{self.dbname}"')
        migrate(self.cluster.unix_dsn(self.dbname))
        with self.admin() as c:
            c.execute(HISTORY_SQL)
        for _ in self.replicas:
            self.proxies.append(BlackHoleProxy(self.cluster.port))
        self.write_conf()

    def replica_dsn(self, slot: int) -> str:
        """The DSN dispatcher `slot` and its workers use: through that slot's proxy."""
        return self.cluster.tcp_dsn(self.dbname, self.proxies[slot].port)

    def admin_dsn(self) -> str:
        """The soak's own connections: the Unix socket, never partitioned."""
        return self.cluster.unix_dsn(self.dbname)

    def admin(self) -> psycopg.Connection:
        return psycopg.connect(self.admin_dsn(), autocommit=True, application_name="chaos-admin")

    def admin_retry(self, fn, tries: int = 60):
        for i in range(tries):
            try:
                with self.admin() as c:
                    return fn(c)
            except psycopg.OperationalError:
                if i == tries - 1:
                    raise
                time.sleep(0.5)
        return None

    # ---- dispatchers
    def start_replica(self, r: Replica) -> None:
        env = {
            **os.environ,
            "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "PEPSI_DSN": self.replica_dsn(r.slot),
            "CHAOS_LOG": str(self.logdir),
            "PEPSI_WORKER_RECONNECT_TIMEOUT": "60",
        }
        env.pop("PEPSI_CONFIG", None)
        out = open(self.base / f"dispatcher-{r.slot}.log", "a")
        out.write(f"==== start {r.starts} at {time.time():.3f}\n")
        out.flush()
        r.proc = subprocess.Popen(
            [str(DISPATCH), "-c", str(self.conf), "-L", "INFO", "serve"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        out.close()
        r.starts += 1
        r.expect_exit = False
        r.started_bad = self.conf_bad or self.overlay_bad

    def supervise(self) -> None:
        now = time.time()
        for r in self.replicas:
            if r.proc is None:
                if now >= r.restart_at:
                    self.start_replica(r)
                continue
            rc = r.proc.poll()
            if rc is None:
                if r.stopped_until and now >= r.stopped_until:
                    os.kill(r.proc.pid, signal.SIGCONT)
                    r.stopped_until = 0.0
                continue
            r.exits.append(rc)
            self.table["dispatcher exits"][f"exit {rc}"] += 1
            if rc not in (0, -9) and not r.expect_exit and not (rc == 2 and r.started_bad):
                last = ""
                for line in (self.base / f"dispatcher-{r.slot}.log").read_text().splitlines():
                    if "error" in line.lower():
                        last = line
                self.notes.append(
                    f"dispatcher slot {r.slot} pid {r.proc.pid} exited {rc} without a fault"
                    f" asking it to: {last[-200:] or '(no error line)'}"
                )
            r.proc = None
            r.restart_at = now + 1.0

    def sighup(self, live: list[Replica]) -> int:
        """SIGHUP to the replicas that catch it; returns how many got it.

        A replica exec'd a few milliseconds ago may still be starting its
        interpreter, where SIGHUP has its default action (it dies by it, exit -1):
        no program can handle a signal before it runs. Such a replica has not
        read the file yet (pepsi-dispatch installs its handlers first), so it
        starts with the new one anyway; it is left alone (the file is already
        written when this runs).
        """
        sent = 0
        for r in live:
            if catches(r.proc.pid, signal.SIGHUP):
                os.kill(r.proc.pid, signal.SIGHUP)
                sent += 1
            else:
                self.table["faults"]["SIGHUP withheld: replica still exec'ing"] += 1
        return sent

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.proc is not None and r.proc.poll() is None]

    def running_replicas(self) -> list[Replica]:
        return [r for r in self.live() if not r.stopped_until]

    def kill_tree(self, pid: int) -> int:
        cmap = children_map()
        tree = descendants(pid, cmap)
        t = time.time()
        n = 0
        for p in [pid, *tree]:
            try:
                os.kill(p, signal.SIGKILL)
                self.kills.append((p, t))
                n += 1
            except ProcessLookupError:
                pass
        return n

    # ---- load
    def load(self) -> None:
        conn = None
        while not self.stop_all.is_set():
            if not self.enqueue_on.is_set():
                time.sleep(0.1)
                continue
            try:
                if conn is None:
                    conn = self.admin()
                n = self.rng_load.randint(1, 3)
                for _ in range(n):
                    x = self.rng_load.random()
                    payload = {"fail": True} if x < 0.03 else {"pause": True} if x < 0.08 else {}
                    mid = conn.execute(
                        "SELECT pepsi.enqueue('a', %s::jsonb)", (json.dumps(payload),)
                    ).fetchone()[0]
                    self.enqueued.append(mid)
            except psycopg.Error:
                conn = None
                time.sleep(0.5)
            time.sleep(self.rng_load.uniform(0.5, 1.5))

    # ---- faults
    def worker_pids(self, r: Replica) -> list[int]:
        """The replica's workers: its children but its group sentinel."""
        cmap = children_map()
        kids = cmap.get(r.proc.pid, []) if r.proc else []
        return [p for p in kids if not is_sentinel(p)]

    def fault(self, name: str) -> str:
        rng = self.rng
        live = self.running_replicas()
        if name == "kill9_dispatcher":
            if not live:
                return "skipped"
            r = rng.choice(live)
            r.expect_exit = True
            n = self.kill_tree(r.proc.pid)
            return f"slot {r.slot}: SIGKILL to dispatcher and its tree ({n} processes)"
        if name in ("kill9_worker", "kill9_child"):
            cands = []
            for r in live:
                for w in self.worker_pids(r):
                    if name == "kill9_worker":
                        cands.append(w)
                    else:
                        cands.extend(c for c in children_map().get(w, []) if "one.sh" in comm(c))
            if not cands:
                return "skipped"
            pid = rng.choice(sorted(cands))
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return "skipped"
            self.kills.append((pid, time.time()))
            return f"SIGKILL pid {pid} ({comm(pid)[:60]})"
        if name == "sigstop_dispatcher":
            if len(live) < 2:
                return "skipped"
            r = rng.choice(live)
            d = ORPHAN_TIMEOUT + POLL_INTERVAL + rng.uniform(1.0, 4.0)
            os.kill(r.proc.pid, signal.SIGSTOP)
            r.stopped_until = time.time() + d
            return f"slot {r.slot}: SIGSTOP for {d:.1f} s"
        if name in ("terminate_dispatcher_conns", "terminate_worker_conns"):
            like = (
                ["pepsi-dispatch%"]
                if name == "terminate_dispatcher_conns"
                else ["pepsi-worker%", "chaos-worker%"]
            )

            def term(c):
                return c.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE application_name LIKE ANY(%s) AND pid <> pg_backend_pid()",
                    (like,),
                ).fetchone()[0]

            try:
                n = self.admin_retry(term, tries=3)
            except psycopg.Error as exc:
                return f"skipped ({exc.__class__.__name__})"
            return f"{n} backend(s) terminated"
        if name == "pg_restart":
            mode = rng.choice(["fast", "immediate"])
            self.cluster.stop(mode, check=False)
            time.sleep(rng.uniform(0.5, 3.0))
            self.cluster.start()
            return f"stop -m {mode}, start"
        if name == "partition":
            if not live:
                return "skipped"
            r = rng.choice(live)
            d = rng.uniform(1.0, 2.5 * ORPHAN_TIMEOUT)
            self.proxies[r.slot].partition()
            self.pending_actions.append((time.time() + d, "heal", r.slot))
            return f"slot {r.slot}: black hole for {d:.1f} s"
        if name == "reload_file":
            st = rng.choice("abc")
            self.parallelism[st] = rng.randint(1, 3)
            self.write_conf()
            sent = self.sighup(live)
            return f"PARALLELISM of {st} = {self.parallelism[st]} + SIGHUP to {sent}"
        if name == "reload_overlay":
            st = rng.choice("abc")
            q = rng.randint(1, 3)

            def up(c):
                c.execute(
                    "INSERT INTO pepsi.config VALUES (%s, 'QUEUE_LIMIT', %s)"
                    " ON CONFLICT (section, option) DO UPDATE SET value = excluded.value",
                    (f"stage-{st}", str(q)),
                )

            self.admin_retry(up, tries=3)
            return f"overlay QUEUE_LIMIT of {st} = {q}"
        if name == "bad_reload":
            for r in live:
                r.expect_exit = True
            if rng.random() < 0.5:
                self.write_conf(bad=True)
                self.sighup(live)
                self.pending_actions.append((time.time() + 1.5, "restore_file", None))
                return "file: NEXT of a = nosuch + SIGHUP (restored after 1.5 s)"

            def bad(c):
                c.execute(
                    "INSERT INTO pepsi.config VALUES ('stage-a', 'NEXT', 'nosuch')"
                    " ON CONFLICT (section, option) DO UPDATE SET value = excluded.value"
                )

            self.admin_retry(bad, tries=3)
            self.overlay_bad = True
            self.pending_actions.append((time.time() + 1.5, "restore_overlay", None))
            return "overlay: NEXT of a = nosuch (deleted after 1.5 s)"
        if name == "sigterm_restart":
            if not live:
                return "skipped"
            r = rng.choice(live)
            r.expect_exit = True
            os.kill(r.proc.pid, signal.SIGTERM)
            return f"slot {r.slot}: SIGTERM (restarted by the supervisor when it exits)"
        raise ValueError(name)

    def run_actions(self, all_now: bool = False) -> None:
        now = time.time()
        keep = []
        for at, what, arg in self.pending_actions:
            if at > now and not all_now:
                keep.append((at, what, arg))
                continue
            if what == "heal":
                self.proxies[arg].heal()
            elif what == "restore_file":
                self.write_conf()
            elif what == "restore_overlay":
                self.admin_retry(
                    lambda c: c.execute(
                        "DELETE FROM pepsi.config WHERE section = 'stage-a' AND option = 'NEXT'"
                    )
                )
                self.overlay_bad = False
        self.pending_actions = keep

    # ---- phases
    def queue_counts(self) -> dict[str, int]:
        rows = self.admin_retry(
            lambda c: c.execute(
                "SELECT status, count(*) FROM pepsi.messages GROUP BY status"
            ).fetchall()
        )
        return {s: n for s, n in rows}

    def wait_quiet(self, timeout: float) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.supervise()
            counts = self.queue_counts()
            if not any(counts.get(s) for s in ("pending", "running", "paused")):
                return True
            time.sleep(0.5)
        return False

    def stop_replicas(self) -> None:
        for r in self.live():
            r.expect_exit = True
            if r.stopped_until:
                os.kill(r.proc.pid, signal.SIGCONT)
                r.stopped_until = 0.0
            os.kill(r.proc.pid, signal.SIGTERM)
        for r in self.replicas:
            if r.proc is None:
                continue
            try:
                rc = r.proc.wait(timeout=SHUTDOWN_TIMEOUT + 30)
            except subprocess.TimeoutExpired:
                self.notes.append(f"slot {r.slot}: did not stop within 33 s of SIGTERM; killed")
                self.kill_tree(r.proc.pid)
                rc = r.proc.wait()
            r.exits.append(rc)
            self.table["dispatcher exits"][f"exit {rc}"] += 1
            if rc != 0:
                self.notes.append(f"slot {r.slot}: clean stop exited {rc}")
            r.proc = None

    def stats(self) -> dict:
        def q(c):
            stages = {
                s: {"processed": p, "failed": f, "timeouts": t, "crashes": cr}
                for s, p, f, t, cr in c.execute(
                    "SELECT stage, processed, failed, timeouts, crashes FROM pepsi.stage_stats"
                )
            }
            g = c.execute(
                "SELECT stage_runs, messages, failed, timeouts, crashes FROM pepsi.dispatch_stats"
            ).fetchone()
            keys = ("stage_runs", "messages", "failed", "timeouts", "crashes")
            return {"stages": stages, "global": dict(zip(keys, g, strict=True))}

        return self.admin_retry(q)

    def history(self, after: int = 0) -> list[dict]:
        keys = ("id", "old_stage", "new_stage", "old_status", "new_status", "old_did", "new_did")
        rows = self.admin_retry(
            lambda c: c.execute(
                "SELECT id, old_stage, new_stage, old_status, new_status, old_did, new_did, t"
                " FROM public.chaos_history WHERE n > %s ORDER BY n",
                (after,),
            ).fetchall()
        )
        return [{**dict(zip(keys, r[:7], strict=True)), "t": r[7]} for r in rows]

    def start_load(self) -> None:
        self.rng_load = random.Random(f"{self.seed}-{self.mode}-load")
        self.watcher = Watcher(self.logdir)
        self.watcher.start()
        threading.Thread(target=self.load, daemon=True, name="load").start()
        for r in self.replicas:
            self.start_replica(r)
        self.enqueue_on.set()

    def run(self) -> checker.Verdict:
        say(
            f"mode {self.mode}: {self.seconds:g} s of faults, seed {self.seed},"
            f" faults {','.join(self.faults)}; files in {self.base}"
        )
        self.setup()
        self.start_load()
        t_end = time.time() + self.seconds
        next_fault = time.time() + self.rng.uniform(2.0, 4.0)
        while time.time() < t_end:
            self.supervise()
            self.run_actions()
            if time.time() >= next_fault and self.faults:
                name = self.rng.choice(self.faults)
                try:
                    what = self.fault(name)
                except Exception as exc:  # a fault that could not be thrown is a harness note
                    what = f"skipped ({type(exc).__name__}: {exc})"
                key = "skipped" if what.startswith("skipped") else "thrown"
                self.table["faults"][f"{name} {key}"] += 1
                say(f"fault {name}: {what}")
                next_fault = time.time() + self.rng.uniform(1.0, 5.0)
            time.sleep(0.1)
        say("faults stop; healing, draining")
        self.enqueue_on.clear()
        self.run_actions(all_now=True)
        for p in self.proxies:
            p.heal()
        quiet = self.wait_quiet(180)
        if not quiet:
            self.extra.append(
                checker.Violation(
                    "stuck", f"not quiet 180 s after the faults stopped: {self.queue_counts()}"
                )
            )
        say(f"quiet: {quiet} {self.queue_counts()}; clean stop")
        return self.tail_and_check()

    def tail_and_check(self) -> checker.Verdict:
        """Clean stop, the fault-free tail between two clean stops, then the checker."""
        watcher = self.watcher
        self.stop_replicas()
        stranded_after_stop = self.admin_retry(
            lambda c: c.execute(
                "SELECT count(*) FROM pepsi.workqueue WHERE status = 'running'"
            ).fetchone()[0]
        )
        if stranded_after_stop:
            self.extra.append(
                checker.Violation(
                    "stranded",
                    f"{stranded_after_stop} row(s) running after every dispatcher stopped cleanly",
                )
            )
        # The fault-free tail: exact stats between two clean stops.
        before = self.stats()
        hist_n = self.admin_retry(
            lambda c: c.execute("SELECT coalesce(max(n), 0) FROM public.chaos_history").fetchone()[
                0
            ]
        )
        for r in self.replicas:
            self.start_replica(r)
        with self.admin() as c:
            for _ in range(20):
                self.enqueued.append(c.execute("SELECT pepsi.enqueue('a')").fetchone()[0])
        tail_quiet = self.wait_quiet(90)
        if not tail_quiet:
            self.extra.append(
                checker.Violation(
                    "stuck", f"fault-free tail not done in 90 s: {self.queue_counts()}"
                )
            )
        self.stop_replicas()
        after = self.stats()
        time.sleep(0.5)
        watcher.stop_flag.set()
        watcher.join()
        self.stop_all.set()
        # the evidence
        events = []
        for f in sorted(self.logdir.iterdir()):
            for line in f.read_text().splitlines():
                try:
                    events.append(json.loads(line))
                except ValueError:
                    pass  # a line cut by SIGKILL
        history = self.history()
        tail_history = self.history(hist_n)
        dead = {}
        for did, t, query in self.admin_retry(
            lambda c: c.execute("SELECT did, t, query FROM public.chaos_deleted").fetchall()
        ):
            if "reset_orphans" in (query or ""):
                dead.setdefault(did, []).append(t)
        rows = [
            {"id": i, "stage": s, "status": st, "timeout": to, "dispatcher_id": d}
            for i, s, st, to, d in self.admin_retry(
                lambda c: c.execute(
                    "SELECT workqueue_id, stage, status, extract(epoch FROM timeout)::float8,"
                    " dispatcher_id FROM pepsi.messages"
                ).fetchall()
            )
        ]
        (self.base / "evidence.json").write_text(
            json.dumps(
                {
                    "kills": self.kills,
                    "last_alive": watcher.dead,
                    "declared_dead": dead,
                    "enqueued": self.enqueued,
                    "before": before,
                    "after": after,
                }
            )
        )
        verdict = checker.check(
            events=events,
            last_alive=watcher.dead,
            kills=self.kills,
            declared_dead=dead,
            history=history,
            rows=rows,
            enqueued=self.enqueued,
            now=time.time(),
            live_dids=None,
            stage_stats=after["stages"],
            tail=(before, after, tail_history),
        )
        verdict.violations[:0] = self.extra
        self.report(verdict, rows, events)
        return verdict

    def report(self, verdict: checker.Verdict, rows: list[dict], events: list[dict]) -> None:
        status = Counter(r["status"] for r in rows)
        tracebacks = 0
        for f in self.base.glob("dispatcher-*.log"):
            tracebacks += f.read_text(errors="replace").count("Traceback")
        print()
        print(f"==== chaos soak, mode {self.mode}, seed {self.seed}, {self.seconds:g} s")
        print(f"{'fault':<40} {'count':>6}")
        for k, n in sorted(self.table["faults"].items()):
            print(f"{k:<40} {n:>6}")
        for k, n in sorted(self.table["dispatcher exits"].items()):
            print(f"{'dispatcher ' + k:<40} {n:>6}")
        print(f"{'messages enqueued':<40} {len(self.enqueued):>6}")
        for s, n in sorted(status.items()):
            print(f"{'rows ' + s:<40} {n:>6}")
        print(f"{'stage-program runs logged':<40} {verdict.notes.get('runs', 0):>6}")
        for k, n in sorted(verdict.notes.items()):
            if k != "runs":
                print(f"{k:<40.40} {n:>6}")
        print(f"{'tracebacks in dispatcher logs':<40} {tracebacks:>6}")
        reasons = self.admin_retry(
            lambda c: c.execute(
                "SELECT regexp_replace(left(coalesce(state->>'dispatch_error', state->>'error',"
                " '?'), 60), '[0-9]+', 'N', 'g'), count(*) FROM pepsi.messages"
                " WHERE status <> 'done' GROUP BY 1 ORDER BY 2 DESC"
            ).fetchall()
        )
        for reason, n in reasons:
            print(f"  not done: {n:>4} x {reason}")
        for n in self.notes:
            print(f"note: {n}")
        if verdict.ok:
            print(f"VERDICT ({self.mode}): PASS")
        else:
            print(f"VERDICT ({self.mode}): FAIL {verdict.by_kind()}")
            for v in verdict.violations[:40]:
                print(f"  {v}")
            if len(verdict.violations) > 40:
                print(f"  ... and {len(verdict.violations) - 40} more")
        print(flush=True)

    def cleanup(self, keep: bool) -> None:
        self.stop_all.set()
        for r in self.replicas:
            if r.proc is not None and r.proc.poll() is None:
                self.kill_tree(r.proc.pid)
                r.proc.wait()
        for p in self.proxies:
            p.close()
        try:
            self.cluster.stop("immediate", check=False)
        except Exception:
            pass
        if not keep:
            # The cluster goes; the logs (dispatchers', stage programs') stay for reading.
            shutil.rmtree(self.cluster.home, ignore_errors=True)
            shutil.rmtree(self.base / "pg", ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", default=os.environ.get("CHAOS_MODE", "both"))
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("CHAOS_SECONDS", "300")))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--faults", default=os.environ.get("CHAOS_FAULTS", ""))
    ap.add_argument("--keep", action="store_true", help="keep the logs and cluster files")
    args = ap.parse_args(argv)
    seed = args.seed
    if seed is None:
        env = os.environ.get("CHAOS_SEED", "")
        seed = int(env) if env else random.SystemRandom().randrange(1, 10**9)
    faults = [f for f in args.faults.split(",") if f] or FAULTS
    unknown = set(faults) - set(FAULTS)
    if unknown:
        ap.error(f"unknown faults: {', '.join(sorted(unknown))} (known: {', '.join(FAULTS)})")
    modes = ["single", "competing"] if args.mode == "both" else [args.mode]
    say(f"seed {seed} (replay with CHAOS_SEED={seed})")
    results = {}
    for mode in modes:
        base = Path(tempfile.mkdtemp(prefix=f"pepsi-chaos-{mode}-", dir="/tmp"))
        os.chmod(base, 0o755)
        soak = Soak(mode, args.seconds, seed, faults, base)
        try:
            results[mode] = soak.run().ok
        finally:
            soak.cleanup(args.keep or not results.get(mode, False))
    for mode, ok in results.items():
        say(f"{mode}: {'PASS' if ok else 'FAIL'} (seed {seed})")
    return 0 if results and all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
