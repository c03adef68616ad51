"""Unit tests of the claim's parameters (coordinator/database/postgres.py): no database."""

from __future__ import annotations

from pepsi_dispatch.coordinator.database.port import ClaimParams
from pepsi_dispatch.coordinator.database.postgres import ClaimStatement


def test_the_claim_sends_each_stages_line_limit_as_given() -> None:
    """pepsi.claim_lines renders a row's line only where its stage's limit is
    above 0, so the limits go as they are (NULL: no lines at all)."""
    claim = ClaimStatement()
    stages, caps = ["a", "b"], [4, 4]
    limits = claim.args(7, ClaimParams(stages, caps, None, [0, 0]))["line_limits"]
    assert limits == "{0,0}"  # an int[] literal
    assert claim.args(7, ClaimParams(stages, caps, None, None))["line_limits"] is None
    limits = claim.args(7, ClaimParams(stages, caps, None, [0, 4096]))["line_limits"]
    assert limits == "{0,4096}"


def test_the_claim_always_skips_locked_rows() -> None:
    """Another role's lock on a pending row (an operator's open cancel, an
    application's SELECT ... FOR UPDATE) must never stall the claim."""
    args = ClaimStatement().args(7, ClaimParams(["a"], [4], [None]))
    assert args["skip_locked"] is True
