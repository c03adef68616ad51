"""Unit tests of coordinator/lease.py: when a competing replica that cannot renew its
heartbeat stops its workers."""

from __future__ import annotations

import pytest

from pepsi_dispatch.contract import INF
from pepsi_dispatch.coordinator.lease import Lease, margin


@pytest.mark.parametrize(
    ("orphan_timeout", "interval", "expected"),
    [
        (300.0, 30.0, 30.0),  # the shipped defaults: one heartbeat interval
        (300.0, 1.0, 30.0),  # a short POLL_INTERVAL: at least a tenth of ORPHAN_TIMEOUT
        (6.0, 2.0, 2.0),
        (3.0, 5.0, 1.0),  # never more than a third
    ],
)
def test_the_margin_is_a_heartbeat_interval_within_bounds(
    orphan_timeout: float, interval: float, expected: float
) -> None:
    assert margin(orphan_timeout, interval) == pytest.approx(expected)


def test_the_lease_lapses_a_margin_before_orphan_timeout_after_the_last_renewal() -> None:
    lease = Lease(True, 6.0, 2.0)
    lease.renewed(100.0)
    assert lease.deadline() == pytest.approx(104.0)
    assert not lease.due(103.9)
    assert lease.due(104.0)
    lease.lapsed = True  # acted on: not due again until renewed
    assert lease.deadline() == INF and not lease.due(200.0)
    lease.renewed(200.0)
    assert not lease.lapsed and lease.deadline() == pytest.approx(204.0)


def test_an_older_renewal_never_moves_the_deadline_back() -> None:
    lease = Lease(True, 6.0, 2.0)
    lease.renewed(100.0)
    lease.renewed(99.0)
    assert lease.deadline() == pytest.approx(104.0)


def test_single_mode_and_an_unstarted_replica_have_no_deadline() -> None:
    single = Lease(False, 300.0, 30.0)
    single.renewed(0.0)
    assert single.deadline() == INF
    assert Lease(True, 300.0, 30.0).deadline() == INF
