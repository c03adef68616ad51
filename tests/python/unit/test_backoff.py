"""Unit tests of the one backoff type: no database, no clock."""

import pytest

from pepsi_dispatch.backoff import Backoff


def test_next_doubles_up_to_the_cap():
    b = Backoff(0.1, 0.5)
    assert [b.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]


def test_reset_starts_over_at_first():
    b = Backoff(1.0, 60.0)
    b.next()
    b.next()
    assert b.started
    b.reset()
    assert not b.started
    assert b.next() == 1.0


def test_peek_does_not_advance():
    b = Backoff(0.1, 2.0)
    assert b.peek() == 0.1
    assert b.peek() == 0.1
    assert b.next() == 0.1
    assert b.peek() == 0.2


def test_uncapped_backoff_keeps_doubling():
    b = Backoff(0.005)
    assert [b.next() for _ in range(4)] == [0.005, 0.01, 0.02, 0.04]


@pytest.mark.parametrize("first,cap", [(0, 1), (-1, 1), (2, 1)])
def test_nonsense_bounds_are_refused(first, cap):
    with pytest.raises(ValueError):
        Backoff(first, cap)


def test_spawn_cooldown_keeps_its_numbers():
    """A stage's cooldown: 1 s doubling to 60 s, forgotten after an answer."""
    from pepsi_dispatch.coordinator.workers.stage_pool import StagePool

    class _SC:
        name = "s"

    pool = StagePool(_SC(), 1)  # type: ignore[arg-type]
    pool.start_cooldown(0.0, "crash")
    assert pool.cooldown_until == 1.0
    pool.start_cooldown(0.5, "again")  # still cooling down: neither extended nor doubled
    assert pool.cooldown_until == 1.0
    pool.start_cooldown(1.0, "crash")
    assert pool.cooldown_until == 3.0
    pool.success()
    pool.start_cooldown(10.0, "crash")
    assert pool.cooldown_until == 11.0
