"""Database sessions passed from a recycled SDK worker to its replacement through
the stage's template (pepsi_dispatch/sdk/lending.py), with the real dispatcher,
real forked workers and a real PostgreSQL.

What must hold: a replacement gets its predecessor's backend only after the
session was reset (nothing a handler left in it survives into the next
worker); a worker killed by SIGKILL takes its session down with it at once,
as if it had connected itself (the template keeps no copy of a lent socket);
a session the server ended while it waited in the template is never lent; no
id is held twice and PARALLELISM holds throughout.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import psycopg
import pytest
from dispatch_harness import (  # noqa: F401
    PYTHON,
    ROOT,
    Harness,
    harness_fixture,
    read_worker_log,
    wait_until,
)

from pepsi_dispatch.sdk import lending
from pepsi_dispatch.sdk.connection import connector
from pepsi_dispatch.sdk.lending import LEND_ENV

SDK_WORKER = "tests/python/support/workers/sdk_scripted_worker.py"
RAW_FORKING = "tests/python/support/workers/forking_raw_worker.py"
DEFAULT_SEARCH_PATH = '"$user", public'


def _conf(h: Harness, log: Path, **stage_opts):
    program = f"{PYTHON} {ROOT / SDK_WORKER} --default-commit --log {log}"
    stages = {"a": {"PROGRAM": program, **stage_opts}}
    return h.conf(stages, CONFIG_FILE=str(h.tmp / "pepsi.conf"), WORKER_IDLE_TIMEOUT="60 s")


def _sessions(h: Harness, ids: list[int]) -> list[dict]:
    return [h.row(i)["state"]["session"] for i in ids]


def _run_one_at_a_time(h: Harness, n: int) -> list[int]:
    """Enqueue ``n`` session probes one after the other (each after the last is done)."""
    ids = []
    for _ in range(n):
        ids += h.enqueue("a", [{"plan": {"a": {"op": "finish", "session": True}}}])
        h.wait_all(timeout=30)
    return ids


def test_a_recycled_worker_takes_over_its_predecessors_session_reset(h: Harness) -> None:
    log = h.tmp / "sdk.log"
    d = h.start(_conf(h, log, PARALLELISM=1, QUEUE_LIMIT=1, MAX_MESSAGES=2))
    ids = _run_one_at_a_time(h, 20)
    assert h.counts() == {"done": 20}, d.tail()
    seen = _sessions(h, ids)
    workers = sorted({s["pid"] for s in seen})
    assert len(workers) >= 9, seen  # recycled every 2 messages
    assert max(sum(1 for s in seen if s["pid"] == w) for w in workers) <= 2
    # Backends outlive their workers: once the first workers (which connected
    # themselves) are gone, the replacements run on sessions passed on.
    by_backend: dict[int, set[int]] = {}
    for s in seen:
        by_backend.setdefault(s["backend"], set()).add(s["pid"])
    assert max(len(pids) for pids in by_backend.values()) >= 2, by_backend
    assert len(by_backend) <= len(workers) - 3, by_backend
    # Each worker's first message found a clean session, whoever used it before;
    # its second found what its own first left (the probe does change the session).
    firsts, seconds = {}, {}
    for s in seen:
        (seconds if s["pid"] in firsts else firsts)[s["pid"]] = s
    for s in firsts.values():
        assert s["search_path"] == DEFAULT_SEARCH_PATH, s
        # the server checks for its client while a statement runs, on a session
        # passed on (reset) as on a fresh one
        assert s["client_check"] == "1s", s
        assert s["advisory_locks"] == 0, s
        assert s["temp_table"] is False, s
    assert seconds, "no worker ran two messages"
    for s in seconds.values():
        assert s["search_path"] == "pg_catalog, public", s
        assert s["advisory_locks"] == 1 and s["temp_table"] is True, s
    runs = read_worker_log(log).runs
    assert sorted(r.wq_id for r in runs) == sorted(ids)  # each id ran once
    assert d.terminate() == 0


def test_lending_switched_off_gives_each_worker_its_own_backend(h: Harness) -> None:
    log = h.tmp / "sdk.log"
    conf = _conf(h, log, PARALLELISM=1, QUEUE_LIMIT=1, MAX_MESSAGES=2)
    d = h.start(conf, env={LEND_ENV: "0"})
    seen = _sessions(h, _run_one_at_a_time(h, 8))
    by_backend: dict[int, set[int]] = {}
    for s in seen:
        by_backend.setdefault(s["backend"], set()).add(s["pid"])
    assert max(len(pids) for pids in by_backend.values()) == 1, by_backend
    assert d.terminate() == 0


def test_a_sigkilled_worker_ends_its_lent_session_at_once(h: Harness) -> None:
    """The worker dies inside its transaction (an inserted row, locks held): the
    backend is gone within seconds and nothing it did is kept, although the
    session had been lent by the template (which would keep it open, with the
    transaction, if it still held a copy of the socket)."""
    log = h.tmp / "sdk.log"
    h.conn.execute("CREATE TABLE public.sdk_log (id bigint, note text)")
    d = h.start(_conf(h, log, PARALLELISM=1, QUEUE_LIMIT=1, MAX_MESSAGES=2))
    # Probe until a worker's first message runs on a session an earlier worker
    # gave back; the next message is that worker's second (MAX_MESSAGES 2).
    earlier: list[dict] = []
    for _ in range(30):
        earlier += _sessions(h, _run_one_at_a_time(h, 1))
        last = earlier[-1]
        first_of_its_worker = len(earlier) == 1 or earlier[-2]["pid"] != last["pid"]
        passed_on = any(
            s["backend"] == last["backend"] and s["pid"] != last["pid"] for s in earlier
        )
        if first_of_its_worker and passed_on:
            break
    else:
        pytest.fail(f"no worker ran on a session passed on: {earlier}")
    (victim,) = h.enqueue("a", [{"plan": {"a": {"op": "kill", "insert": "killed"}}}])
    h.wait_all(timeout=30)
    assert h.row(victim)["status"] == "failed"
    assert "SIGKILL" in h.row(victim)["state"]["dispatch_error"]

    def backend_gone() -> bool:
        row = h.conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (last["backend"],)
        ).fetchone()
        return row is not None and row[0] == 0

    wait_until(backend_gone, 5, message="the killed worker's backend ended")
    assert h.conn.execute("SELECT count(*) FROM public.sdk_log").fetchone() == (0,)
    # the stage goes on, on a new session
    after = _sessions(h, _run_one_at_a_time(h, 2))
    assert all(s["backend"] != last["backend"] for s in after)
    assert d.terminate() == 0


@pytest.mark.parametrize("connect", [True, False], ids=["worker.connect", "psycopg.connect"])
def test_a_protocol_worker_that_connects_through_the_sdk_passes_sessions_on(
    h: Harness, connect: bool
) -> None:
    """A program that speaks the protocol itself, calls fork_point() and connects
    with pepsi_dispatch.worker.connect() gets sessions passed on; one that
    connects by itself opens its own each time (its template never connects)."""
    log, sessions = h.tmp / "raw.log", h.tmp / "sessions"
    flags = f" --connect --sessions {sessions}" if connect else ""
    program = f"{PYTHON} {ROOT / RAW_FORKING} --log {log}{flags}"
    stages = {"a": {"PROGRAM": program, "PARALLELISM": 1, "QUEUE_LIMIT": 1, "MAX_MESSAGES": 5}}
    d = h.start(h.conf(stages, WORKER_IDLE_TIMEOUT="60 s"))
    ids: list[int] = []
    for _ in range(12):  # a few at a time, so that workers end one after the other
        ids += h.enqueue("a", 5)
        h.wait_all(timeout=30)
    assert h.counts() == {"done": 60}
    runs = read_worker_log(log).runs
    assert sorted(r.wq_id for r in runs) == sorted(ids)  # each id ran once
    workers = {r.pid for r in runs}
    assert len(workers) >= 10, workers
    if connect:
        pairs = [tuple(map(int, line.split())) for line in sessions.read_text().splitlines()]
        backends = {b for _, b in pairs}
        assert len(backends) <= len(pairs) - 3, pairs
    else:
        named = h.conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pepsi-worker a'"
        ).fetchone()
        assert named == (0,)  # no session waits in the template
    assert d.terminate() == 0


# The template's side alone, in this process: what it lends and what it drops.


@pytest.fixture
def lender(dsn: str):
    made = lending.Lender(connector(dsn, "a", 2))
    yield made
    made.close()
    for loan in made.lent.values():
        if loan.conn is not None:
            loan.conn.close()


def _want(made: lending.Lender, now: float) -> None:
    """What a worker that connected itself says as it ends; then the template's loop."""
    socket.socket(fileno=os.dup(made._back.fileno())).send(lending.WANT)
    made.collect(now, between_requests=True)


def test_the_template_prepares_a_session_per_ask_up_to_idle_max_and_lends_it(lender) -> None:
    now = time.monotonic()
    assert lender.take(now).conn is None  # nothing waiting: the worker connects itself
    for _ in range(lending.IDLE_MAX + 2):  # asks beyond IDLE_MAX open nothing more
        _want(lender, now)
    assert len(lender.idle) == lending.IDLE_MAX
    backends = {conn.info.backend_pid for conn, _ in lender.idle}
    assert len(backends) == lending.IDLE_MAX
    loan = lender.take(now)
    assert loan.conn is not None and loan.fd == loan.conn.pgconn.socket
    assert loan.conn.execute("SELECT 1").fetchone() == (1,)
    assert len(lender.idle) == lending.IDLE_MAX - 1
    loan.conn.close()


def test_asks_that_came_together_are_opened_one_per_loop_turn(lender) -> None:
    """Workers that connected themselves end at once: the template opens one
    session per turn of its loop, so that a fork request that comes meanwhile
    waits for at most one connect; asks beyond IDLE_MAX open nothing."""
    now = time.monotonic()
    back = socket.socket(fileno=os.dup(lender._back.fileno()))
    for _ in range(lending.IDLE_MAX + 1):
        back.send(lending.WANT)
    for turn in range(1, lending.IDLE_MAX + 1):
        lender.collect(now, between_requests=True)
        assert len(lender.idle) == turn
        assert lender.deadline() == 0.0  # more asked for: look again at once
    lender.collect(now, between_requests=True)  # the last ask: IDLE_MAX wait already
    assert len(lender.idle) == lending.IDLE_MAX
    assert lender.deadline() == pytest.approx(now + lending.IDLE_SECONDS)


def test_a_fork_that_found_no_session_has_one_opened_for_the_next(lender) -> None:
    """An SDK template's fork that finds none waiting (the worker connects
    itself, and can never pass that session on) has one opened right after,
    between requests: the stage keeps a spare for its next recycle."""
    now = time.monotonic()
    assert lender.take(now).conn is None
    assert lender.idle == [] and lender.deadline() == 0.0
    lender.collect(now, between_requests=True)
    assert len(lender.idle) == 1
    loan = lender.take(now)
    assert loan.conn is not None
    loan.conn.close()


def test_a_protocol_template_opens_nothing_until_its_workers_use_sessions(dsn: str) -> None:
    """fork_point()'s template: its workers may never connect through the SDK,
    so a fork that found no session opens nothing, until a worker gives one
    back or asks for one."""
    made = lending.Lender(connector(dsn, "a", 2), workers_connect=False)
    try:
        now = time.monotonic()
        assert made.take(now).conn is None
        made.collect(now, between_requests=True)
        assert made.idle == [] and made.deadline() is None
        _want(made, now)  # a worker that connected through connect() ended
        assert len(made.idle) == 1 and made.open_after_miss
        made.take(now).conn.close()
        assert made.take(now).conn is None  # from now on, a miss has one opened
        made.collect(now, between_requests=True)
        assert len(made.idle) == 1
    finally:
        made.close()


def test_a_lender_for_a_stage_of_parallelism_1_keeps_two(dsn: str) -> None:
    made = lending.Lender(connector(dsn, "a", 2), idle_max=2)
    try:
        now = time.monotonic()
        for _ in range(4):
            _want(made, now)
        assert len(made.idle) == 2
    finally:
        made.close()


def test_the_first_session_opened_is_rehearsed_once_and_lent_idle(dsn: str) -> None:
    """The SDK's template asks, on its first session, what each worker asks first
    (the start facts and an empty pin), so that the caches those fill are
    inherited; nothing of it stays in the session, and later ones are not
    rehearsed."""
    seen: list[int] = []

    def rehearse(conn: psycopg.Connection) -> None:
        seen.append(conn.info.backend_pid)
        conn.execute("BEGIN")
        conn.execute("SELECT 1")
        conn.execute("ROLLBACK")

    made = lending.Lender(connector(dsn, "a", 2), rehearse=rehearse)
    try:
        now = time.monotonic()
        _want(made, now)
        _want(made, now)
        assert seen == [made.idle[0][0].info.backend_pid]
        for conn, _ in made.idle:
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    finally:
        made.close()


def test_a_rehearsal_the_database_refuses_still_lends_the_session(dsn: str) -> None:
    """A database that cannot answer the rehearsal (not migrated, a role
    without a grant) lends the session all the same: each worker says why."""

    def rehearse(conn: psycopg.Connection) -> None:
        conn.execute("SELECT pepsi.no_such_function()")

    made = lending.Lender(connector(dsn, "a", 2), rehearse=rehearse)
    try:
        _want(made, time.monotonic())
        ((conn, _),) = made.idle
        assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        made.close()


def test_the_sdk_rehearsal_locks_nothing_and_leaves_no_transaction(dsn: str, monkeypatch) -> None:
    from pepsi_dispatch.sdk import entry

    monkeypatch.setenv("PEPSI_STAGE", "a")
    monkeypatch.setenv("PEPSI_DISPATCHER_ID", "424242")
    with psycopg.connect(dsn, autocommit=True) as conn:
        entry._rehearse(conn, {"a": lambda msg: None})
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        locks = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid()"
            " AND locktype <> 'virtualxid' AND relation IS DISTINCT FROM 'pg_locks'::regclass"
        ).fetchone()
        assert locks == (0,)


def test_the_session_that_waited_longest_is_lent_first(lender) -> None:
    """Lent oldest first, every waiting session keeps being used while the stage
    recycles, so the spare does not expire between waves."""
    first, second = time.monotonic(), time.monotonic() + 1
    _want(lender, first)
    _want(lender, second)
    (older, _), (newer, _) = lender.idle
    for expected in (older, newer):
        taken = lender.take(second).conn
        assert taken is expected
        taken.close()


def test_a_waiting_session_the_server_ended_is_not_lent(lender, dsn: str) -> None:
    now = time.monotonic()
    _want(lender, now)
    ((conn, _),) = lender.idle
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    wait_until(lambda: not lending._healthy(conn), 5, message="the socket says it closed")
    assert lender.take(now).conn is None
    assert conn.closed


def test_a_waiting_session_expires(lender) -> None:
    now = time.monotonic()
    _want(lender, now)
    ((conn, _),) = lender.idle
    assert lender.deadline() == pytest.approx(now + lending.IDLE_SECONDS)
    lender.collect(now + lending.IDLE_SECONDS + 0.1)
    assert lender.idle == [] and conn.closed


def test_a_lent_session_whose_worker_died_is_forgotten(lender, dsn: str) -> None:
    """The template's copy of a lent socket names /dev/null; once the worker is
    gone without giving it back, the loan is dropped and nothing reaches the
    server through the template."""
    now = time.monotonic()
    _want(lender, now)
    loan = lender.take(now)
    backend = loan.conn.info.backend_pid
    pid = os.fork()
    if pid == 0:  # a worker that holds the session, then dies
        lender.in_worker(loan)
        os._exit(0)
    lender.lent_to(loan, pid)
    assert os.readlink(f"/proc/self/fd/{loan.fd}") == os.devnull
    os.waitpid(pid, 0)
    lender.collect(now)
    assert lender.lent == {}
    with psycopg.connect(dsn, autocommit=True) as probe:
        wait_until(
            lambda: (
                probe.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (backend,)
                ).fetchone()[0]
                == 0
            ),
            5,
            message="the dead worker's backend ended",
        )


def _in_a_worker(made: lending.Lender, loan: lending.Loan, body) -> int:
    """Fork a worker that takes ``loan`` and runs ``body(conn)``: its exit status
    (0 when body returned True), after the template's side saw the fork."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            made.in_worker(loan)
            code = 0 if body(lending.take_lent()) else 3
        finally:
            os._exit(code)
    made.lent_to(loan, pid)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_only_an_idle_session_is_given_back(lender) -> None:
    now = time.monotonic()
    _want(lender, now)

    def in_a_transaction(conn) -> bool:
        conn.execute("BEGIN")
        conn.execute("SELECT pg_advisory_xact_lock(1)")
        return lending.give_back(conn) is False

    assert _in_a_worker(lender, lender.take(now), in_a_transaction) == 0
    lender.collect(now)
    assert lender.idle == [] and lender._wanted  # asks for a new one instead
    lender.collect(now, between_requests=True)
    assert len(lender.idle) == 1

    def idle_but_dirty(conn) -> bool:
        conn.execute("SET search_path = pg_catalog")
        conn.execute("LISTEN somewhere")
        if lending.give_back(conn) is not True:
            return False
        try:  # what the ending worker still does with it reaches nothing
            conn.execute("SET search_path = evil")
        except psycopg.OperationalError:
            return True
        return False

    loan = lender.take(now)
    backend = loan.conn.info.backend_pid
    assert _in_a_worker(lender, loan, idle_but_dirty) == 0
    lender.collect(now)
    ((back, _),) = lender.idle
    assert back is loan.conn and lender.lent == {}
    assert back.info.backend_pid == backend
    assert back.execute("SHOW search_path").fetchone() == (DEFAULT_SEARCH_PATH,)
    assert back.execute("SELECT count(*) FROM pg_listening_channels()").fetchone() == (0,)


def test_an_ask_that_came_with_a_request_is_served_right_after_it(lender) -> None:
    now = time.monotonic()
    socket.socket(fileno=os.dup(lender._back.fileno())).send(lending.WANT)
    lender.collect(now)  # a fork request was waiting: nothing is opened now
    assert lender.idle == [] and lender.deadline() == 0.0  # the template looks again at once
    lender.collect(now, between_requests=True)
    assert len(lender.idle) == 1 and lender.deadline() == pytest.approx(now + lending.IDLE_SECONDS)


def test_a_programs_own_connection_is_neither_given_back_nor_replaced(dsn: str) -> None:
    """leave(0, conn) with a connection the program opened itself: closed, and
    fork_point()'s template is not asked to open one (the next worker would not
    use it)."""
    made = lending.Lender(connector(dsn, "a", 2), workers_connect=False)
    now = time.monotonic()

    def own_connection(_lent) -> bool:
        own = psycopg.connect(dsn, autocommit=True)
        return lending.give_back(own) is False

    try:
        assert _in_a_worker(made, made.take(now), own_connection) == 0
        made.collect(now, between_requests=True)
        assert made.idle == [] and not made._wanted and not made.open_after_miss
    finally:
        made.close()


def test_a_forked_worker_has_no_descriptor_of_its_siblings_sessions(lender) -> None:
    """A worker forked while a sibling holds a lent session, and while another
    session waits in the template: neither number is open in it (the template's
    copies name /dev/null; the worker closes them rather than keep them until its
    collector finds the objects)."""
    now = time.monotonic()
    _want(lender, now)
    sibling = lender.take(now)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the sibling: holds its session until told to end
        lender.in_worker(sibling)
        os.read(r, 1)
        os._exit(0)
    lender.lent_to(sibling, pid)
    _want(lender, now)  # a session waits too
    ((waiting, _),) = lender.idle
    numbers = {sibling.fd, waiting.pgconn.socket}

    def none_of_theirs(_lent) -> bool:
        return not numbers & {int(fd) for fd in os.listdir("/proc/self/fd")}

    try:
        assert _in_a_worker(lender, lending.Loan(None, -1, back=lender._back), none_of_theirs) == 0
    finally:
        os.write(w, b"x")
        os.waitpid(pid, 0)
        os.close(r)
        os.close(w)
    assert waiting.execute("SELECT 1").fetchone() == (1,)  # the template's copy is intact
