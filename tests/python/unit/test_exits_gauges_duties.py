"""Small parts of the coordinator driven directly (no database, no processes):
what a dead worker's end does to its ids (exits.settle_exit), the heartbeat's
gauges (gauges.collect), the duties' timing (duties.Every) and the paused-row
flip's timer (database.flip.PausedFlip)."""

from __future__ import annotations

import signal
from collections import deque
from types import SimpleNamespace
from typing import Any

from pepsi_dispatch.contract import INF
from pepsi_dispatch.coordinator import gauges
from pepsi_dispatch.coordinator.database.flip import AFTER_ANSWERS, PausedFlip
from pepsi_dispatch.coordinator.database.port import Requeue
from pepsi_dispatch.coordinator.duties import Every, earliest
from pepsi_dispatch.coordinator.failwatch import FailureWatch
from pepsi_dispatch.coordinator.ledger import Ledger
from pepsi_dispatch.coordinator.stats import Stats
from pepsi_dispatch.coordinator.workers.exits import ExitBooks, settle_exit
from pepsi_dispatch.coordinator.workers.lastwords import LastWords
from pepsi_dispatch.coordinator.workers.process import ExitKind, Overdue


class Pool:
    def __init__(self) -> None:
        self.cooldowns: list[str] = []
        self.name = "a"

    def start_cooldown(self, now: float, why: str) -> None:
        self.cooldowns.append(why)


def slot(in_hand: int | None = None) -> SimpleNamespace:
    """A stand-in in-hand slot naming ``in_hand`` (None: the worker never wrote it)."""
    return SimpleNamespace(in_hand=lambda: in_hand)


def words(*lines: str) -> LastWords:
    said = LastWords()
    said.note(lines)
    return said


def dead(**fields: Any) -> SimpleNamespace:
    base = dict(stage="a", pid=9, head_since=10.0, stopping=False, killed=False,
                answers_received=3, stop_reason=None, slot=slot(), last_words=words(),
                overdue=None)  # fmt: skip
    base.update(fields)
    return SimpleNamespace(**base)


def books() -> ExitBooks:
    return ExitBooks(Ledger(), FailureWatch(60.0, 0.0), Stats())


def test_a_crash_fails_the_head_and_releases_the_rest() -> None:
    b, pool = books(), Pool()
    settle_exit(b, dead(), pool, ExitKind.CRASH, -signal.SIGKILL, [4, 5, 6], 0, 12.0, False, "x")  # type: ignore[arg-type]
    assert [(f[0], f[1]) for f in b.ledger.failures] == [(4, "failed")]
    assert "SIGKILL" in b.ledger.failures[0][2]
    assert b.ledger.releases == [5, 6]
    assert b.stats.stages["a"].crashes == 1
    assert pool.cooldowns == []  # it had answered before: no cooldown


def test_a_crash_with_a_message_in_hand_fails_that_one_only() -> None:
    b = books()
    w = dead(slot=slot(5))
    settle_exit(b, w, Pool(), ExitKind.CRASH, -signal.SIGKILL, [4, 5, 6], 0, 12.0, False, "x")  # type: ignore[arg-type]
    assert [f[0] for f in b.ledger.failures] == [5]
    assert sorted(b.ledger.releases) == [4, 6]


def test_an_in_hand_id_the_worker_no_longer_holds_blames_the_head() -> None:
    b = books()
    w = dead(slot=slot(99))
    settle_exit(b, w, Pool(), ExitKind.CRASH, 1, [4, 5], 0, 12.0, False, "x")  # type: ignore[arg-type]
    assert [f[0] for f in b.ledger.failures] == [4]


def overdue(head: int) -> Overdue:
    """What the MAX_RUNTIME watchdog notes of a worker it kills (head ``head``)."""
    return Overdue(head, 4.5, "timeout: no answer within MAX_RUNTIME (4 s); worker killed")


def test_max_runtime_times_out_the_message_in_hand_only() -> None:
    """The hanging handler is the in-hand one, behind the overdue head: it alone
    times out; the head and the rest are released (as a crash's blame)."""
    b = books()
    w = dead(slot=slot(6), overdue=overdue(4), killed=True)
    settle_exit(b, w, Pool(), ExitKind.TIMEOUT, -signal.SIGKILL, [4, 5, 6, 7], 0, 12.0, False, "x")  # type: ignore[arg-type]
    assert [(f[0], f[1]) for f in b.ledger.failures] == [(6, "timeout")]
    assert "MAX_RUNTIME (4 s)" in b.ledger.failures[0][2]
    assert sorted(b.ledger.releases) == [4, 5, 7]
    assert (b.stats.stages["a"].timeouts, b.stats.stages["a"].crashes) == (1, 0)


def test_max_runtime_without_the_in_hand_slot_times_out_the_overdue_head() -> None:
    b = books()
    w = dead(overdue=overdue(4), killed=True)
    settle_exit(b, w, Pool(), ExitKind.TIMEOUT, -signal.SIGKILL, [4, 5], 0, 12.0, False, "x")  # type: ignore[arg-type]
    assert [(f[0], f[1]) for f in b.ledger.failures] == [(4, "timeout")]
    assert b.ledger.releases == [5]


def test_max_runtime_whose_head_was_answered_as_it_died_blames_nothing() -> None:
    """The overdue head's answer was in the pipe (read at the reap): nothing
    overran after all; the rest are released, nothing times out."""
    b = books()
    w = dead(slot=slot(5), overdue=overdue(4), killed=True)
    settle_exit(b, w, Pool(), ExitKind.TIMEOUT, -signal.SIGKILL, [5, 6], 0, 12.0, False, "x")  # type: ignore[arg-type]
    assert b.ledger.failures == [] and b.ledger.releases == [5, 6]
    assert "a" not in b.stats.stages or b.stats.stages["a"].timeouts == 0


def test_exit_75_releases_everything_fails_nothing_and_cools_the_stage() -> None:
    b, pool = books(), Pool()
    settle_exit(b, dead(), pool, ExitKind.TEMPFAIL, 75, [4, 5], 0, 12.0, False, "x")  # type: ignore[arg-type]
    assert b.ledger.failures == [] and b.ledger.releases == [4, 5]
    assert len(pool.cooldowns) == 1 and "could not reach the database" in pool.cooldowns[0]


def test_a_worker_dying_before_any_answer_cools_its_stage_down() -> None:
    b, pool = books(), Pool()
    w = dead(answers_received=0, last_words=words("ImportError: no module named x", "", "v1"))
    settle_exit(b, w, pool, ExitKind.EXITED, 1, [], 0, 12.0, False, "x")  # type: ignore[arg-type]
    # The cause says how it ended and quotes its stderr's error line and last lines.
    assert pool.cooldowns == [
        "worker pid 9 exited with code 1 before answering anything;"
        " its stderr: ImportError: no module named x | v1"
    ]


def test_a_stopped_worker_that_failed_before_answering_logs_its_stderr(caplog) -> None:
    said = words("Error: Cannot find module 'pg'", "Node.js v20.20.2")
    w = dead(answers_received=0, stop_reason="template probe", last_words=said)
    settle_exit(books(), w, Pool(), ExitKind.STOPPED, 1, [], 0, 12.0, False, "x")  # type: ignore[arg-type]
    [record] = [r for r in caplog.records if "stopped" in r.getMessage()]
    assert record.levelname == "WARNING"
    assert record.getMessage().endswith("its stderr: Error: Cannot find module 'pg'")


def test_gauges_count_workers_by_state_and_ids_in_flight() -> None:
    def w(inflight: list[int]) -> SimpleNamespace:
        return SimpleNamespace(inflight=deque(inflight), stopping=False, retiring=False)

    def paused(flag: bool) -> SimpleNamespace:
        return SimpleNamespace(paused=flag)

    def health(state: str):
        return lambda now: {"state": state, "at": now}

    pools = {
        "a": SimpleNamespace(
            name="a",
            workers=[w([1, 2]), w([])],
            config=SimpleNamespace(paused=False),
            health=health("serving"),
        ),
        "b": SimpleNamespace(
            name="b", workers=[], config=SimpleNamespace(paused=True), health=health("paused")
        ),
    }
    gone = SimpleNamespace(name="old", workers=[w([3])], config=None)
    gone.workers[0].stopping = True
    out = gauges.collect(pools, [gone], 3, 17, Stats(), 30.0, 5.0)  # type: ignore[arg-type]
    # Each configured stage's health, at the time given (a removed stage has none).
    assert out["stages"] == {
        "a": {"state": "serving", "at": 5.0},
        "b": {"state": "paused", "at": 5.0},
    }
    assert out["workers"]["a"] == {"busy": 1, "idle": 1, "retiring": 0, "stopping": 0}
    assert out["workers"]["old"]["stopping"] == 1
    assert out["inflight"] == {"a": 2, "b": 0, "old": 1}
    assert out["paused_stages"] == ["b"] and out["round_trips"] == 17
    assert out["heartbeat_interval"] == 30.0 and out["inflight_ids"] == 3


def test_every_is_due_once_per_interval_and_never_while_inactive() -> None:
    ran: list[float] = []
    active = [True]
    duty = Every("tick", 5.0, ran.append, lambda: active[0])
    duty.start(100.0)
    assert duty.next_due(100.0) == 105.0
    duty.run(105.0)
    assert ran == [105.0] and duty.next_due(105.0) == 110.0
    active[0] = False
    assert duty.next_due(110.0) == INF
    assert earliest([duty, Every("other", 1.0, ran.append)], 0.0) == 0.0
    assert earliest([], 0.0) == INF


def test_the_flip_is_due_at_the_rows_due_time_and_soon_after_answers() -> None:
    flip = PausedFlip(Ledger(), Stats())
    flip.done(Requeue(0, 0, 0, 30.0), 100.0)  # next paused row due in 30 s
    assert flip.deadline() == 130.005 and not flip.is_due(129.0)
    flip.dirty = True  # answers came in: a stage may have paused a row
    assert flip.deadline() == 100.0 + AFTER_ANSWERS
    assert flip.is_due(100.0 + AFTER_ANSWERS)
    flip.failed(101.0)  # requeue_due itself failed: not again for a while
    assert not flip.is_due(105.0)
    flip.done(Requeue(0, 0, 0, None), 200.0)  # no paused row left
    assert flip.deadline() == INF


def test_changed_gauges_go_out_early_at_most_once_a_second() -> None:
    early = gauges.EarlyGauges(1.0)
    assert early.should_send(10.0, ("a", 1))  # a change, nothing sent yet
    early.sent_now(10.0, ("a", 1))
    assert not early.should_send(10.2, ("a", 1)) and early.due == float("inf")  # no change
    assert not early.should_send(10.5, ("a", 2))  # changed, but too soon: a timer for 11.0
    assert early.due == 11.0
    assert early.should_send(11.0, ("a", 2))
