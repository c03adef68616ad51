"""Unit tests of the in-flight ledger (pepsi_dispatch/coordinator/ledger.py): no
database, no processes, no clock. Each test names the dispatcher's invariant
(docs/INTERNALS.md) it holds."""

from __future__ import annotations

from pepsi_dispatch.coordinator.ledger import Ledger, OwedWrites


class W:
    """A worker handle: the ledger compares handles by identity only."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


# -- invariant 1: an id is never in two workers --------------------------------


def test_invariant_1_an_id_has_one_holder_the_latest_hand_out():
    """Invariant 1: handed to B while A's answer is on the way, the id is B's
    alone; A's late answer does not take it away from B."""
    a, b = W("a"), W("b")
    ledger = Ledger()
    ledger.hand([7], a)
    ledger.hand([7], b)
    assert ledger.holder_of == {7: b}
    ledger.let_go(7, a, still_in_w=False)  # A's late answer
    assert ledger.holder_of == {7: b}
    ledger.let_go(7, b, still_in_w=False)
    assert not ledger.held(7)


def test_invariant_1_unanswered_ids_are_released_only_when_reaped():
    """Invariant 1: a worker's unanswered ids leave the ledger only through
    reaped(), which the loop calls after the worker is dead and reaped; until
    then no release about them is owed and none is sent."""
    w = W("w")
    ledger = Ledger()
    ledger.hand([1, 2, 3], w)
    assert not ledger.owed()
    ledger.reaped(w, [1, 2, 3], [])
    assert ledger.holder_of == {}
    ledger.release([1, 2, 3])  # as the exit classification says (killed)
    assert ledger.owed().releases == [1, 2, 3]


def test_invariant_1_a_release_of_an_id_held_again_is_never_sent():
    """Invariant 1: a release owed about an id that another worker holds now
    would give that worker's row away: it is dropped."""
    a, b = W("a"), W("b")
    ledger = Ledger()
    ledger.hand([5], a)
    ledger.reaped(a, [], [5])  # EPIPE: never delivered to a
    ledger.hand([5], b)  # meanwhile claimed again (not by this path in practice)
    assert ledger.owed().releases == []
    assert ledger.releases == []  # dropped for good


def test_invariant_1_reaping_does_not_touch_ids_another_worker_holds():
    """Invariant 1: reaping A forgets only what A holds."""
    a, b = W("a"), W("b")
    ledger = Ledger()
    ledger.hand([1, 2], a)
    ledger.hand([2], b)
    ledger.reaped(a, [1, 2], [])
    assert ledger.holder_of == {2: b}


# -- invariant 2: owed writes about ids in flight again are dropped --------------


def test_invariant_2_an_owed_write_about_an_id_in_flight_again_is_dropped():
    """Invariant 2: the stage advanced id 9, it was claimed for its next stage
    and handed to B before A's answer was read: A's check and a failure about
    9 are dropped, never sent, and stay dropped after B lets go of it."""
    a, b = W("a"), W("b")
    ledger = Ledger()
    ledger.hand([9, 10], a)
    ledger.hand([9], b)
    ledger.let_go(9, a, still_in_w=False)
    ledger.answered(9, "s1")
    ledger.let_go(10, a, still_in_w=False)
    ledger.failed(10, "failed", "boom")
    owed = ledger.owed()
    assert owed.checks == [] and owed.failures == [(10, "failed", "boom")]
    ledger.let_go(9, b, still_in_w=False)
    assert ledger.owed().checks == []


def test_invariant_2_a_copy_held_twice_by_one_worker_stays_protected_until_its_last_answer():
    """Invariant 2: the stage advanced id 4 to itself and it was handed to the
    same worker again: the first answer leaves it held, so the write owed by
    that first answer is dropped; only the last answer lets go."""
    w = W("w")
    ledger = Ledger()
    ledger.hand([4], w)
    ledger.hand([4], w)
    inflight = [4, 4]
    inflight.pop(0)
    ledger.let_go(4, w, still_in_w=4 in inflight)
    ledger.answered(4, "s")
    assert ledger.held(4)
    assert ledger.owed().checks == []  # the first copy's check: dropped
    inflight.pop(0)
    ledger.let_go(4, w, still_in_w=4 in inflight)
    ledger.answered(4, "s")
    assert not ledger.held(4)
    assert ledger.owed().checks == [4]


# -- invariant 3: owed writes survive a failed pipeline; release first; order ------


def test_invariant_3_owed_writes_survive_a_failed_pipeline():
    """Invariant 3: until sent() the writes stay owed, however often they are read."""
    ledger = Ledger()
    ledger.failed(1, "failed", "x")
    ledger.answered(2, "s")
    ledger.release([3])
    first = ledger.owed()
    # ... the pipeline fails: neither released() nor sent() is called
    assert ledger.owed() == first
    ledger.released()  # the release statement went through, the pipeline did not
    again = ledger.owed()
    assert again.releases == [] and again.failures == first.failures
    assert again.checks == first.checks
    ledger.sent()
    assert not ledger.owed()
    assert ledger.check_stage == {}


def test_invariant_3_a_release_runs_before_the_claim_and_order_is_kept():
    """Invariant 3: OwedWrites lists releases first (their own statement, ahead
    of the claim) and keeps every list in the order the events happened."""
    ledger = Ledger()
    ledger.release([30, 10])
    ledger.failed(8, "timeout", "t")
    ledger.failed(2, "failed", "f")
    ledger.answered(6, "s")
    ledger.answered(5, "s")
    owed = ledger.owed()
    assert list(vars(owed)) == ["releases", "failures", "checks"]
    assert owed.releases == [30, 10]
    assert [f[0] for f in owed.failures] == [8, 2]
    assert owed.checks == [6, 5]


def test_invariant_3_strays_leave_rows_with_owed_writes_to_those_writes():
    """Invariant 3 (after a reconnect): rows the database says we hold but no
    worker has are released, except those with an owed write; a check whose
    row moved to another stage is dropped and the row released."""
    w = W("w")
    ledger = Ledger()
    ledger.hand([1], w)
    ledger.failed(2, "failed", "x")
    ledger.answered(3, "a")  # still at a: its check decides
    ledger.answered(4, "a")  # advanced to b meanwhile: released
    ledger.release([5])
    held = {1, 2, 3, 4, 5, 6}
    assert ledger.checks_to_verify(held) == {3, 4}
    assert ledger.strays(held, {3: "a", 4: "b"}) == [4, 6]
    assert ledger.checks == [3]


# -- invariant 4: floors ----------------------------------------------------------


def test_invariant_4_floors_follow_claims_and_drop_below_every_write():
    """Invariant 4 (docs/INTERNALS.md, "Claim floors"): a claim raises its
    stage's floor to the highest id returned; any answered, failed or
    released id X may be pending again, so every floor drops below X."""
    ledger = Ledger()
    ledger.raise_floors([(50, "a"), (70, "a"), (40, "b")])
    assert ledger.floors == {"a": 70, "b": 40}
    assert ledger.claim_bounds(["b", "a", "c"], with_requeue=False) == [40, 70, None]
    ledger.answered(60, "a")
    ledger.owed()
    assert ledger.floors == {"a": 59, "b": 40}
    ledger.lower_floors(OwedWrites([10], [], []))
    assert ledger.floors == {"a": 9, "b": 9}


def test_invariant_4_rows_of_another_priority_never_raise_a_floor():
    """Invariant 4 with priorities: the floor bounds only priority-0 rows, so a
    claimed row of priority 5 (id 90) taken before pending priority-0 rows with
    lower ids must not lift the floor past them."""
    ledger = Ledger()
    ledger.raise_floors([(90, "a"), (10, "a"), (11, "a")], off_floor=[90])
    assert ledger.floors == {"a": 11}
    ledger.raise_floors([(95, "b")], off_floor=[95])
    assert "b" not in ledger.floors


def test_invariant_4_floors_are_never_used_in_competing_mode():
    """Invariant 4: a competing replica never bounds its claim."""
    ledger = Ledger(competing=True)
    ledger.raise_floors([(50, "a")])
    assert ledger.floors == {}
    ledger.floors["a"] = 50  # even if one were set somehow
    assert ledger.claim_bounds(["a"], with_requeue=False) is None


def test_invariant_4_the_claim_is_unbounded_when_a_requeue_shares_the_pipeline():
    """Invariant 4: a requeue ahead of the claim may make low ids pending."""
    ledger = Ledger()
    ledger.raise_floors([(50, "a")])
    assert ledger.claim_bounds(["a"], with_requeue=True) is None
    assert ledger.claim_bounds(["a"], with_requeue=False) == [50]


def test_invariant_4_rescan_forgets_floors_and_asks_for_a_claim():
    """Invariant 4: a notification, reconnect or reload may make low ids
    pending: floors go, a claim is due; after a pipeline the claim is done."""
    ledger = Ledger()
    ledger.claimed_pass()
    ledger.raise_floors([(50, "a")])
    ledger.rescan()
    assert ledger.floors == {} and ledger.claim_needed
    ledger.claimed_pass()
    assert not ledger.claim_needed
    ledger.raise_floors([(50, "a")])
    ledger.forget_floors()
    assert ledger.floors == {} and not ledger.claim_needed


def test_drop_all_forgets_everything_after_being_declared_dead():
    """A competing replica declared dead: its rows were reset by another; the
    ledger forgets holders, owed writes and floors, and wants a claim."""
    w = W("w")
    ledger = Ledger()
    ledger.hand([1], w)
    ledger.failed(2, "failed", "x")
    ledger.answered(3, "a")
    ledger.release([4])
    ledger.claimed_pass()
    ledger.drop_all()
    assert ledger.holder_of == {} and not ledger.owed() and ledger.claim_needed


def test_invariant_2_peeking_drops_nothing_until_the_wake_that_sends():
    """Invariant 2 (and 3): the select timeout only peeks at the owed writes; a
    write about an id whose old holder has not answered yet is dropped only by
    the wake that sends, after that wake's answers let go of it."""
    a = W("a")
    ledger = Ledger()
    ledger.hand([14], a)  # at stage a; it advanced 14, its answer is on the way
    ledger.release([14])  # claimed at stage b meanwhile, no place for it
    assert not ledger.owes_writes()  # the select timeout's peek
    assert ledger.releases == [14]  # still owed
    ledger.let_go(14, a, still_in_w=False)  # a's answer arrives
    assert ledger.owes_writes()
    assert ledger.owed().releases == [14]


def test_invariant_1_a_claimed_id_that_finds_no_worker_supersedes_its_old_holder():
    """Invariant 1 and 2: stage a advanced 20 and its answer is still on the way
    when a claim takes 20 at stage b and finds no worker for it. The release is
    sent even if a's answer comes only after the wake that sends (dropping it
    left the row running at b with no worker, and a's answer check then failed
    it: 'answered 0 but left it running', seen in test_one_message_per_worker)."""
    a = W("a")
    ledger = Ledger()
    ledger.hand([20], a)
    ledger.unplaced([20])
    assert not ledger.held(20)
    assert ledger.owed().releases == [20]  # a has not answered yet
    ledger.released()
    ledger.let_go(20, a, still_in_w=False)  # a's late answer leaves it alone
    ledger.answered(20, "a")
    owed = ledger.owed()
    assert owed.releases == [] and owed.checks == [20]  # the row is pending: a no-op
