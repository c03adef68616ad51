"""Unit tests of how a worker's end settles its ids (invariant 5 of docs/INTERNALS.md):
``process.classify_exit`` decides, the ledger applies. No database, no processes."""

from __future__ import annotations

import pytest

from pepsi_dispatch.contract import EX_TEMPFAIL
from pepsi_dispatch.coordinator.ledger import Ledger
from pepsi_dispatch.coordinator.workers.process import ExitKind, classify_exit


class W:
    pass


def kind_of(
    rc: int,
    *,
    killed: bool = False,
    stopping: bool = False,
    shutting_down: bool = False,
    unanswered: int = 0,
    undelivered: int = 0,
    started: bool = True,
    db_connected: bool = True,
    timed_out: bool = False,
) -> ExitKind:
    return classify_exit(
        rc,
        killed=killed,
        stopping=stopping,
        shutting_down=shutting_down,
        unanswered=unanswered,
        undelivered=undelivered,
        started=started,
        db_connected=db_connected,
        timed_out=timed_out,
    )


def settle(kind: ExitKind, w: W, ledger: Ledger, unanswered: list[int], undelivered: list[int]):
    """What the loop does with a reaped worker's ids (loop._reap/_settle_exit)."""
    ledger.reaped(w, unanswered, undelivered)
    if kind is ExitKind.CRASH:
        ledger.crashed(unanswered, "worker killed by signal SIGSEGV")
    elif kind is ExitKind.TIMEOUT:
        ledger.crashed(unanswered, "timeout: no answer within MAX_RUNTIME", status="timeout")
    else:
        ledger.release(unanswered)
    return ledger.owed()


def test_invariant_5_crash_fails_the_head_and_releases_the_rest():
    """Invariant 5, crash: the head-of-line message fails, the rest are released."""
    w, ledger = W(), Ledger()
    ledger.hand([3, 4, 5], w)
    kind = kind_of(-11, unanswered=3)
    assert kind is ExitKind.CRASH
    owed = settle(kind, w, ledger, [3, 4, 5], [])
    assert [f[0] for f in owed.failures] == [3]
    assert owed.releases == [4, 5]


def test_invariant_5_died_before_reading_fails_nothing():
    """Invariant 5, died before reading: nothing fails (the stage cools down)."""
    w, ledger = W(), Ledger()
    ledger.hand([3, 4], w)
    kind = kind_of(1, unanswered=2, started=False)
    assert kind is ExitKind.DIED_BEFORE_READING
    owed = settle(kind, w, ledger, [3, 4], [])
    assert owed.failures == [] and owed.releases == [3, 4]


def test_invariant_5_killed_releases_all():
    """Invariant 5, killed: all its ids are released, none failed."""
    w, ledger = W(), Ledger()
    ledger.hand([3, 4], w)
    kind = kind_of(-9, killed=True, unanswered=2)
    assert kind is ExitKind.KILLED
    owed = settle(kind, w, ledger, [3, 4], [])
    assert owed.failures == [] and owed.releases == [3, 4]


def test_invariant_5_max_runtime_makes_the_head_a_timeout():
    """Invariant 5, MAX_RUNTIME: the watchdog kills the worker; once it is
    reaped, the head becomes 'timeout' (a worker without the in-hand slot) and
    the rest are released."""
    w, ledger = W(), Ledger()
    ledger.hand([3, 4], w)
    kind = kind_of(-9, killed=True, timed_out=True, unanswered=2)
    assert kind is ExitKind.TIMEOUT
    owed = settle(kind, w, ledger, [3, 4], [])
    assert [(f[0], f[1]) for f in owed.failures] == [(3, "timeout")]
    assert owed.releases == [4]


def test_invariant_5_epipe_releases_the_undelivered_ids():
    """Invariant 5, EPIPE: ids whose write failed never reached the worker and
    are released; only the ones it read are settled by the exit kind."""
    w, ledger = W(), Ledger()
    ledger.hand([3, 4, 5], w)
    kind = kind_of(-11, unanswered=1, undelivered=2)
    assert kind is ExitKind.CRASH
    owed = settle(kind, w, ledger, [3], [4, 5])
    assert [f[0] for f in owed.failures] == [3]
    assert sorted(owed.releases) == [4, 5]


def test_invariant_5_tempfail_75_releases_all():
    """Invariant 5, exit 75 (EX_TEMPFAIL): 'I could not reach the database;
    nothing I held is done': all released, none failed."""
    assert EX_TEMPFAIL == 75
    w, ledger = W(), Ledger()
    ledger.hand([3, 4], w)
    kind = kind_of(75, unanswered=2)
    assert kind is ExitKind.TEMPFAIL
    owed = settle(kind, w, ledger, [3, 4], [])
    assert owed.failures == [] and owed.releases == [3, 4]


def test_invariant_5_no_stage_78_releases_all():
    """Invariant 5, exit 78 (its stage is not in its configuration): it touched
    nothing, so all are released and none failed (the stage cools down)."""
    from pepsi_dispatch.contract import EXIT_NO_STAGE

    w, ledger = W(), Ledger()
    ledger.hand([3, 4], w)
    kind = kind_of(EXIT_NO_STAGE, unanswered=2, started=False)
    assert kind is ExitKind.NO_STAGE
    owed = settle(kind, w, ledger, [3, 4], [])
    assert owed.failures == [] and owed.releases == [3, 4]


@pytest.mark.parametrize(
    ("kwargs", "kind"),
    [
        ({"rc": -9, "killed": True, "timed_out": True, "shutting_down": True}, ExitKind.TIMEOUT),
        ({"rc": -9, "killed": True, "shutting_down": True, "unanswered": 1}, ExitKind.KILLED),
        ({"rc": -15, "shutting_down": True, "unanswered": 1}, ExitKind.STOPPED),
        ({"rc": 0, "stopping": True}, ExitKind.STOPPED),
        ({"rc": 0}, ExitKind.EXITED),
        ({"rc": 1, "unanswered": 1, "db_connected": False}, ExitKind.DB_DOWN),
        ({"rc": 75, "unanswered": 1, "started": False}, ExitKind.TEMPFAIL),
    ],
)
def test_invariant_5_precedence_of_the_exit_kinds(kwargs, kind):
    """Invariant 5: a MAX_RUNTIME kill beats any other kill beats shutdown beats
    exit 75 beats not-started."""
    rc = kwargs.pop("rc")
    assert kind_of(rc, **kwargs) is kind
