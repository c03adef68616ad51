"""Nothing another role does can stall the coordinator.

A second session holds a real transaction open (an operator's cancel, an
application's SELECT ... FOR UPDATE, a producer's enqueue of a schedule's
dedupe key) while the other stages are timed: they must flow at once, not
after the dispatcher's lock_timeout (10 s), and the locked row or tick is
taken once the lock is gone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from dispatch_harness import Harness, harness_fixture, wait_until  # noqa: F401
from test_dispatch_queue_options import add_schedule, queue_cli

#: Well below the dispatcher's lock_timeout (10 s): a claim that waited on the
#: locked row would miss it.
FLOW_DEADLINE = 6.0

LOCKERS = {
    "an operator's open cancel": "SELECT pepsi.cancel(ARRAY[%s]::bigint[])",
    "an application's SELECT FOR UPDATE": (
        "SELECT 1 FROM pepsi.workqueue WHERE workqueue_id = %s FOR UPDATE"
    ),
}


@contextmanager
def open_transaction(dsn: str, sql: str, args: tuple) -> Iterator[psycopg.Connection]:
    """A second session that ran `sql` in a transaction it keeps open, then rolls back."""
    with psycopg.connect(dsn) as other:
        other.execute(sql, args)
        try:
            yield other
        finally:
            other.rollback()


def elapsed_until_done(h: Harness, ids: list[int], timeout: float) -> float:
    t0 = time.monotonic()
    wait_until(
        lambda: all(h.row(i)["status"] == "done" for i in ids),
        timeout,
        message=lambda: f"{len(ids)} messages done: {h.counts()}",
    )
    return time.monotonic() - t0


def scheduled(h: Harness) -> int:
    """Messages a schedule enqueued."""
    sql = "SELECT count(*) FROM pepsi.messages WHERE state ? 'scheduled_for'"
    return h.conn.execute(sql).fetchone()[0]


@pytest.mark.parametrize("locker", sorted(LOCKERS))
def test_a_row_locked_by_another_session_stalls_no_stage(h: Harness, locker: str) -> None:
    victim = h.enqueue("a", 1)[0]
    with open_transaction(h.dsn, LOCKERS[locker], (victim,)):
        h.start(h.conf(h.pipeline(["a", "b"])))  # its first claim meets the locked row
        others = h.enqueue("a", 5) + h.enqueue("b", 5)
        took = elapsed_until_done(h, others, FLOW_DEADLINE)
        assert h.row(victim)["status"] == "pending", "the locked row is skipped, not taken"
        more = h.enqueue("b", 3)
        took = max(took, elapsed_until_done(h, more, FLOW_DEADLINE))
    # The lock is gone (rolled back): the row is taken by a later claim.
    h.enqueue("b", 1)  # any insert's notification clears the claim floors
    wait_until(lambda: h.row(victim)["status"] == "done", 20, message="the victim done")
    assert took < FLOW_DEADLINE
    assert "lock timeout" not in " ".join(d.log() for d in h.dispatchers).lower()


def test_a_producers_open_transaction_on_a_schedule_key_stalls_no_stage(h: Harness) -> None:
    conf = h.conf({**h.pipeline(["a"]), **h.pipeline(["t"])})
    add_schedule(conf, "pulse", STAGE="t", EVERY="1 s", DEDUPE_KEY="pulse-key")
    with open_transaction(
        h.dsn, "SELECT pepsi.enqueue('t', '{}', dedupe_key => %s)", ("pulse-key",)
    ):
        d = h.start(conf)
        for _ in range(3):  # over several ticks, each meeting the held key
            took = elapsed_until_done(h, h.enqueue("a", 4), FLOW_DEADLINE)
            assert took < 3.0, f"stage a waited {took:.1f} s behind the schedule's tick"
        wait_until(lambda: "waits for a lock" in d.log(), 10, message="the deferral logged")
        assert scheduled(h) == 0, "no tick enqueued while the key's insert is open"
    # Rolled back: the key is free, the next tick is enqueued.
    wait_until(lambda: scheduled(h) >= 1, 10, message="a tick once the key is free")


def test_requeue_failed_leaves_a_key_taken_meanwhile_and_requeues_the_rest(
    conn: psycopg.Connection, dsn: str
) -> None:
    ids = [
        conn.execute("SELECT pepsi.enqueue('s', '{}', dedupe_key => %s)", (k,)).fetchone()[0]
        for k in ("k1", "k2")
    ]
    plain = conn.execute("SELECT pepsi.enqueue('s', '{}')").fetchone()[0]
    conn.execute(
        "UPDATE pepsi.workqueue SET status = 'failed' WHERE workqueue_id = ANY(%s)",
        ([*ids, plain],),
    )
    result: dict[str, object] = {}
    with psycopg.connect(dsn) as producer:
        producer.execute("SELECT pepsi.enqueue('s', '{}', dedupe_key => 'k1')")

        def requeue() -> None:
            try:
                with psycopg.connect(dsn, autocommit=True) as operator:
                    result["n"] = operator.execute("SELECT pepsi.requeue_failed()").fetchone()[0]
            except psycopg.Error as exc:
                result["error"] = exc

        worker = threading.Thread(target=requeue)
        worker.start()
        wait_until(
            lambda: conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE '%requeue_failed%'"
            ).fetchone()[0],
            10,
            message="the requeue waiting on the producer's key",
        )
        producer.commit()
        worker.join(10)
    assert "error" not in result, result.get("error")
    assert result["n"] == 2
    status = dict(
        conn.execute(
            "SELECT workqueue_id, status FROM pepsi.messages WHERE workqueue_id = ANY(%s)",
            ([*ids, plain],),
        ).fetchall()
    )
    assert status == {ids[0]: "failed", ids[1]: "pending", plain: "pending"}


@pytest.mark.parametrize("key", ["", "   ", "\t\n"])
def test_a_dedupe_key_of_only_whitespace_is_refused(conn: psycopg.Connection, key: str) -> None:
    for sql in (
        "SELECT pepsi.enqueue('s', '{}', dedupe_key => %s)",
        "SELECT pepsi.enqueue_many('s', ARRAY['{}']::jsonb[], dedupe_keys => ARRAY[%s])",
    ):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="not only whitespace"):
            conn.execute(sql, (key,))


def test_an_empty_key_on_the_command_line_is_a_usage_error(h: Harness, tmp_path: Path) -> None:
    for key in ("", "  "):
        out = queue_cli(h, "enqueue", "s", "{}", "--force", "--key", key)
        assert out.returncode == 2, out
        assert "--key needs a key" in out.stderr
    assert h.counts() == {}


def test_reschedule_refuses_a_running_message_without_waiting_for_its_worker(
    dsn: str, conn: psycopg.Connection
) -> None:
    """A running message's worker holds its row locked for the handler's whole
    run (the pin). Rescheduling it is refused at once, saying it is running,
    instead of waiting for the handler and then calling it done; a waiting
    message is still moved."""
    running, waiting = (
        conn.execute("SELECT pepsi.enqueue('r', '{}')").fetchone()[0] for _ in range(2)
    )
    conn.execute(
        "UPDATE pepsi.workqueue SET status = 'running', dispatcher_id = 7 WHERE workqueue_id = %s",
        (running,),
    )
    pin = "SELECT count(*) FROM pepsi.pin_messages(ARRAY[%s]::bigint[], 7)"
    with open_transaction(dsn, pin, (running,)):
        t0 = time.monotonic()
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="is running"):
            conn.execute("SET lock_timeout = '5s'")
            conn.execute("SELECT pepsi.reschedule(%s)", (running,))
        assert time.monotonic() - t0 < 2.0, "refused at once, not after the worker's lock"
        due = conn.execute(
            "SELECT pepsi.reschedule(%s, now() + interval '1 hour')", (waiting,)
        ).fetchone()[0]
        assert due is not None
