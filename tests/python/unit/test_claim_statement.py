"""Unit tests of the claim's parameters (coordinator/database/claim_sql.py): no database."""

from __future__ import annotations

from pepsi_dispatch.coordinator.database.claim_sql import ClaimStatement


def test_the_claim_asks_for_lines_only_when_a_stage_takes_them() -> None:
    """Line limits of zeros are sent as NULL: pepsi.claim_lines renders each claimed
    row's text whenever line_limits is not NULL, and only then drops the lines a
    limit of 0 refuses, so zeros would cost the server every row's rendering for
    nothing (a pinning SDK worker takes bare ids)."""
    claim = ClaimStatement(competing=False)
    *_, limits = claim.args(7, ["a", "b"], [4, 4], None, [0, 0])
    assert limits is None
    *_, limits = claim.args(7, ["a", "b"], [4, 4], None, None)
    assert limits is None
    *_, limits = claim.args(7, ["a", "b"], [4, 4], None, [0, 4096])
    assert limits == "{0,4096}"  # an int[] literal


def test_the_claim_always_skips_locked_rows() -> None:
    """Another role's lock on a pending row (an operator's open cancel, an
    application's SELECT ... FOR UPDATE) must never stall the claim."""
    for competing in (False, True):
        args = ClaimStatement(competing).args(7, ["a"], [4], [None], None)
        assert args[3] is True
