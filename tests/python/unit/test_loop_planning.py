"""The loop's planning driven by a fake clock: no database, no
workers. The select timeout is 0 exactly when the wake's database work is not
empty -- invariant 9 of docs/INTERNALS.md: Pipeline.due, which the timeout asks,
agrees with Pipeline.plan, which the wake sends."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from fake_store import FakeStore

from pepsi_dispatch.config import load_config
from pepsi_dispatch.coordinator.database.link import LinkState
from pepsi_dispatch.coordinator.database.port import ClaimParams

if TYPE_CHECKING:
    from pepsi_dispatch.coordinator.dispatcher import Dispatcher


class FakeClock:
    """Monotonic seconds that move only when told to."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def dispatcher(tmp_path: Path, clock: FakeClock, db: FakeStore | None = None) -> Dispatcher:
    # Imported here, not at the top: test_cli replaces pepsi_dispatch.coordinator.dispatcher in
    # sys.modules, which an earlier import of the real module would defeat.
    from pepsi_dispatch.coordinator.dispatcher import Dispatcher

    conf = tmp_path / "pepsi.conf"
    conf.write_text(
        "[pepsi-dispatch]\nSERVICE_USER = root\n[database]\nDSN = postgresql:///none\n"
        "[stage-a]\nPROGRAM = /bin/true\nPARALLELISM = 2\nQUEUE_LIMIT = 3\n"
    )
    d = Dispatcher(load_config(str(conf)), clock=clock, db=db or FakeStore())
    d.link.up(0)  # as after start(), without a database
    d.supervisor.build(d.config)  # pools, no processes yet
    d.supervisor.probes_pending = False  # nor a template probe (a process)
    for duty in d.heartbeat_duties:
        duty.start(clock())  # 30 s: POLL_INTERVAL
    d.flip.at = clock() + 10
    return d


def test_invariant_9_timeout_is_zero_exactly_when_a_claim_is_planned(tmp_path: Path) -> None:
    """Invariant 9: a claim is due (room, claim needed): planned, timeout 0;
    once the claim pass ran, nothing is planned and the loop sleeps until the
    next requeue_due."""
    clock = FakeClock()
    d = dispatcher(tmp_path, clock)
    plan = d.round_trip.plan(clock(), shutting_down=False)
    assert plan and plan.claim == ClaimParams(["a"], [6], None, [0]) and plan.requeue is None
    assert d.next_timeout(clock()) == 0.0
    d.ledger.claimed_pass()
    assert not d.round_trip.plan(clock(), shutting_down=False)
    assert d.next_timeout(clock()) == 10.0


def test_invariant_9_a_due_requeue_is_planned_with_an_unbounded_claim(tmp_path: Path) -> None:
    """Invariant 9 (and 4): at requeue_at the plan holds requeue_due and a
    claim behind it, unbounded even with floors known; the timeout is 0."""
    clock = FakeClock()
    d = dispatcher(tmp_path, clock)
    d.ledger.claimed_pass()
    d.ledger.raise_floors([(40, "a")])
    clock.advance(9.5)
    assert not d.round_trip.plan(clock(), shutting_down=False)
    assert abs(d.next_timeout(clock()) - 0.5) < 1e-9
    clock.advance(0.5)
    plan = d.round_trip.plan(clock(), shutting_down=False)
    assert plan.requeue is not None and plan.claim == ClaimParams(["a"], [6], None, [0])
    assert d.next_timeout(clock()) == 0.0


def test_invariant_9_an_owed_release_is_planned_first(tmp_path: Path) -> None:
    """Invariant 9 (and 3): an owed release makes the plan non-empty."""
    clock = FakeClock()
    d = dispatcher(tmp_path, clock)
    d.ledger.claimed_pass()
    d.ledger.release([5])
    plan = d.round_trip.plan(clock(), shutting_down=False)
    assert plan.owed.releases == [5] and plan.claim is None
    assert d.next_timeout(clock()) == 0.0


def test_invariant_9_nothing_is_planned_while_stopping(tmp_path: Path) -> None:
    """Invariant 9: shutting down, neither claims nor requeues are planned,
    so a claim still 'needed' must not make the loop spin."""
    clock = FakeClock()
    d = dispatcher(tmp_path, clock)
    clock.advance(20)  # requeue_at passed too
    d.shutting_down = True
    d.shutdown_deadline = clock() + 5
    assert not d.round_trip.plan(clock(), shutting_down=True)
    assert d.next_timeout(clock()) == 5.0


def test_invariant_7_a_query_error_holds_all_database_work(tmp_path: Path) -> None:
    """Invariant 7 (and 9): after a query error on healthy connections the link
    HOLDS (lock kept): nothing is planned until the hold is over, and the
    timeout is the hold's end, not 0."""
    clock = FakeClock()
    d = dispatcher(tmp_path, clock, FakeStore())  # both connections up
    d.link.lost(clock(), psycopg.errors.DivisionByZero("division by zero"))
    assert d.link.state is LinkState.HOLDING and d.link.connected
    assert not d.round_trip.plan(clock(), shutting_down=False)
    assert abs(d.next_timeout(clock()) - 0.1) < 1e-9
    clock.advance(0.1)
    assert d.round_trip.plan(clock(), shutting_down=False)  # the claim is still due
    assert d.link.state is LinkState.UP


def test_invariant_9_the_timeouts_boolean_peek_agrees_with_the_plan(tmp_path: Path) -> None:
    """Invariant 9: next_timeout asks Pipeline.due (no plan built); it is
    bool(Pipeline.plan) in every state these tests reach."""
    clock = FakeClock()
    d = dispatcher(tmp_path, clock)

    def agree(stopping: bool = False) -> None:
        now = clock()
        assert d.round_trip.due(now, stopping) == bool(d.round_trip.plan(now, stopping))

    agree()  # a claim is due
    agree(stopping=True)
    d.ledger.claimed_pass()
    agree()  # nothing due
    d.ledger.release([5])
    agree()  # an owed release
    d.ledger.released()
    d.ledger.failed(6, "failed", "x")
    agree()
    d.ledger.sent()
    agree()
    clock.advance(10)
    agree()  # requeue due
    agree(stopping=True)
    d.link.lost(clock(), psycopg.errors.DivisionByZero("division by zero"))
    agree()  # held
