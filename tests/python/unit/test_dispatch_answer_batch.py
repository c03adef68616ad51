"""The batched hot path of answer intake (AnswerIntake._all_ok) does
exactly what the line-by-line loop does: same ledger, same statistics. No
database, no processes: the loop is driven on stand-ins, once with DEBUG on
(which keeps the line-by-line path) and once without (the batched one)."""

from __future__ import annotations

import logging
from collections import deque
from types import SimpleNamespace

import pytest

from pepsi_dispatch.coordinator.failwatch import FailureWatch
from pepsi_dispatch.coordinator.ledger import Ledger
from pepsi_dispatch.coordinator.stats import Stats
from pepsi_dispatch.coordinator.workers.intake import AnswerIntake


def _run(debug: bool, ids: list[int], lines: list[bytes], other: object):
    ledger = Ledger()
    w = SimpleNamespace(
        killed=False, reading=False, inflight=deque(ids), stage="a", pid=1,
        head_since=10.0, answers_received=0,
    )  # fmt: skip
    ledger.hand(ids, w)
    ledger.hand([ids[-1]], other)  # the last id was claimed again by another worker
    owner = SimpleNamespace(pool_of=lambda w: None, on_answers=lambda: None)
    intake = AnswerIntake(ledger, Stats(), FailureWatch(1.0, 0.0), owner)  # type: ignore[arg-type]
    intake._answered = lambda w, pool, now: None  # type: ignore[method-assign]
    logger = logging.getLogger("pepsi_dispatch.coordinator.workers.intake")
    old = logger.level
    logger.setLevel(logging.DEBUG if debug else logging.INFO)
    try:
        intake.take(w, lines, 12.5)  # type: ignore[arg-type]
    finally:
        logger.setLevel(old)
    sup = intake
    c = sup.stats.stages["a"]
    h = sup.stats.service["a"]
    return (
        dict(ledger.holder_of),
        list(ledger.checks),
        dict(ledger.check_stage),
        list(w.inflight),
        w.head_since,
        w.answers_received,
        (c.processed, c.failed, c.seconds),
        (list(h.counts), h.sum),
        (sup.stats.stage_runs, sup.stats.total_stage_runs),
        set(sup.failwatch.succeeded),
    )


@pytest.mark.parametrize("n_answers", [1, 3, 5])
def test_batched_zero_answers_match_one_by_one(n_answers: int) -> None:
    # id 5 is in flight twice (the stage advanced it to itself): only the answer
    # to its last copy lets go of it.
    ids = [4, 5, 6, 5, 7, 8]
    other = object()
    lines = [b"0"] * n_answers
    assert _run(False, ids, lines, other) == _run(True, ids, lines, other)


def test_after_a_batch_a_worker_near_max_messages_gets_its_spare_and_is_recycled() -> None:
    """After the answers: the pool may want a warm spare for this worker, and a
    drained worker at MAX_MESSAGES is stopped (recycled)."""
    calls: list[str] = []
    pool = SimpleNamespace(
        max_messages=2,
        recycled=set(),
        success=lambda: None,
        answered=lambda w, now: None,
        wants_spare=lambda w, now: True,
        template_tried=False,
    )
    owner = SimpleNamespace(
        pool_of=lambda w: pool,
        on_answers=lambda: calls.append("answers"),
        spawn_spare=lambda pool, old, now: calls.append(f"spare for {old.pid}"),
        start_template=lambda pool, w, now: calls.append(f"template after {w.pid}"),
        stop=lambda w, now, why: calls.append(f"stop {w.pid}: {why}"),
    )
    ledger = Ledger()
    w = SimpleNamespace(
        killed=False, reading=False, inflight=deque([1, 2]), stage="a", pid=3, head_since=0.0,
        answers_received=0, sent=2, stopping=False, retiring=False, idle_since=0.0,
        slot=SimpleNamespace(can_template=True),
    )  # fmt: skip
    ledger.hand([1, 2], w)
    intake = AnswerIntake(ledger, Stats(), FailureWatch(1.0, 0.0), owner)  # type: ignore[arg-type]
    intake.take(w, [b"0", b"0"], 5.0)  # type: ignore[arg-type]
    # its slot says the program can be a template: the stage's template is started
    assert calls == [
        "template after 3",
        "spare for 3",
        "answers",
        "stop 3: MAX_MESSAGES (2) reached",
    ]
    assert pool.recycled == {3} and w.idle_since == 5.0
