"""Unit tests of coordinator/comeback.py: what a reconnect does when the server
restarted (its last claims may be lost) or we were declared dead."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fake_store import FakeStore

from pepsi_dispatch.coordinator.comeback import Comeback, ReplicasHold
from pepsi_dispatch.coordinator.database.fence import Fence
from pepsi_dispatch.coordinator.ledger import Ledger


class FakeSupervisor:
    def __init__(self, workers: int, held: int) -> None:
        self.workers = list(range(workers))
        self.held = held
        self.dropped = 0

    def all(self) -> list[Any]:
        return self.workers

    def drop_all(self) -> int:
        self.dropped += 1
        held, self.held, self.workers = self.held, 0, []
        return held


STARTED = ("2026-12-01 10:00:00+00", "2026-12-01 10:00:00+00")
CRASHED = ("2026-12-01 10:00:00+00", "2026-12-01 11:00:00+00")


def comeback(db: FakeStore, ledger: Ledger | None = None) -> tuple[Comeback, FakeSupervisor]:
    """A Comeback on ``db`` with two workers holding five ids, connected once."""
    workers = FakeSupervisor(2, 5)
    c = Comeback(db, workers, ledger or Ledger(), lambda: False)
    c.connected()
    return c, workers


def test_the_same_server_keeps_the_workers() -> None:
    c, workers = comeback(FakeStore(server_epoch=STARTED))
    assert c.check_server_restart() is False
    assert workers.dropped == 0


def test_a_crash_restart_stops_the_workers_keeps_owed_failures_drops_answer_checks(caplog) -> None:
    ledger = Ledger()
    w = object()
    ledger.hand([1, 2, 3], w)
    ledger.failed(7, "failed", "worker exited with code 1")
    ledger.answered(8, "a")
    ledger.floors["a"] = 100
    db = FakeStore(server_epoch=STARTED)
    c, workers = comeback(db, ledger)
    db.server_epoch = CRASHED
    assert c.check_server_restart() is True
    assert workers.dropped == 1
    assert ledger.holding() == 0 and not ledger.holder_of
    assert ledger.failures == [(7, "failed", "worker exited with code 1")]
    assert ledger.checks == [] and 8 not in ledger.check_stage  # its commit may be lost too
    assert ledger.floors == {} and ledger.claim_needed
    assert "database server restarted" in caplog.text and "2 worker(s)" in caplog.text
    # the new epoch is remembered: the next reconnect to it keeps the workers
    assert c.check_server_restart() is False
    assert workers.dropped == 1


def test_an_unknown_epoch_changes_nothing() -> None:
    db = FakeStore(server_epoch=None)
    c, workers = comeback(db)
    db.server_epoch = STARTED
    assert c.check_server_restart() is False  # first sight: nothing to compare with
    db.server_epoch = None
    assert c.check_server_restart() is False
    assert workers.dropped == 0


def test_declared_dead_drops_everything_owed_too() -> None:
    ledger = Ledger()
    ledger.hand([1], object())
    ledger.failed(7, "failed", "x")
    c = Comeback(FakeStore(server_epoch=STARTED), FakeSupervisor(1, 1), ledger, lambda: True)
    c.check_registration()
    assert not ledger.holder_of and ledger.failures == []


def test_declared_dead_releases_rows_left_under_our_id_before_registering_again() -> None:
    """Rows a replica skipped while our workers had them pinned are ours to give back."""
    db = FakeStore(server_epoch=STARTED, competing=True)
    c = Comeback(db, FakeSupervisor(1, 1), Ledger(), lambda: True, Fence(7))
    c.check_registration()
    assert db.released == [(7, None)]


def test_declared_dead_release_that_fails_raises_so_the_check_runs_again() -> None:
    db = FakeStore(server_epoch=STARTED, competing=True)
    db.fail["release"] = RuntimeError("the database is away")
    c = Comeback(db, FakeSupervisor(1, 1), Ledger(), lambda: True, Fence(7))
    with pytest.raises(RuntimeError):
        c.check_registration()


def hold(db: FakeStore) -> ReplicasHold:
    return ReplicasHold(db, Fence(7), orphan_timeout=300.0)


def test_a_competing_replica_claims_nothing_after_connecting_while_replicas_are_away() -> None:
    db = FakeStore(competing=True)
    db.away = [(3, "elsewhere", 10), (5, "elsewhere", 11)]
    h = hold(db)
    h.connected(100.0)
    assert h.holding and h.next_due() == 100.0
    h.check(100.0)
    assert h.holding, "replicas 3 and 5 may still run rows a lost claim freed"
    assert h.next_due() == pytest.approx(100.0 + ReplicasHold.CHECK_EVERY)
    h.check(100.1)  # not due yet: not asked again
    assert db.calls.count("replicas_away") == 1
    db.away = []
    h.check(100.3)
    assert not h.holding and h.next_due() == float("inf")


def test_the_wait_is_logged_after_a_second_with_the_replicas(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    db = FakeStore(competing=True)
    db.away = [(3, "elsewhere", 10)]
    h = hold(db)
    h.connected(0.0)
    h.check(0.0)
    assert "replica(s) 3" not in caplog.text
    h.check(1.2)
    assert "replica(s) 3" in caplog.text and "ORPHAN_TIMEOUT (300 s)" in caplog.text
    assert "pepsi.unregister_dispatcher(N)" in caplog.text  # the way out is named
    db.away = []
    h.check(1.5)
    assert "claiming again" in caplog.text


def test_a_single_dispatcher_never_holds() -> None:
    db = FakeStore(competing=False)
    db.away = [(3, "elsewhere", 10)]
    h = hold(db)
    h.connected(0.0)
    assert not h.holding
    h.check(0.0)
    assert "replicas_away" not in db.calls


def test_a_failing_question_keeps_holding_and_asks_again_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    db = FakeStore(competing=True)
    h = hold(db)
    h.connected(0.0)
    h.failed(0.0, RuntimeError("permission denied for function replicas_away"))
    assert h.holding, "nothing says the others are back"
    assert h.next_due() == pytest.approx(ReplicasHold.RETRY_AFTER_ERROR)
    assert "permission denied" in caplog.text and "serve --check" in caplog.text
    h.check(ReplicasHold.RETRY_AFTER_ERROR)
    assert not h.holding


@pytest.mark.parametrize("competing", [False, True])
def test_every_restart_stops_the_workers_in_both_modes(competing: bool) -> None:
    """A claim commits without waiting for its flush in both modes; a restart
    that looks clean cannot be told from a standby made from a cold copy."""
    db = FakeStore(server_epoch=STARTED, competing=competing)
    c, workers = comeback(db)
    db.server_epoch = ("2026-12-01 12:00:00+00", STARTED[1])  # same statistics reset time
    assert c.check_server_restart() is True
    assert workers.dropped == 1


def test_a_failing_question_is_logged_at_most_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = hold(FakeStore(competing=True))
    h.connected(0.0)
    for t in (0.0, 5.0, 10.0):
        h.failed(t, RuntimeError("permission denied"))
    assert caplog.text.count("cannot ask which replicas are away") == 1
    h.failed(ReplicasHold.SAY_ERROR_EVERY + 1.0, RuntimeError("permission denied"))
    assert caplog.text.count("cannot ask which replicas are away") == 2
