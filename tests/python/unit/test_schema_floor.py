"""The schema floor is the newest migration shipped: code and schema move together."""

from __future__ import annotations

import re
from pathlib import Path

from pepsi_dispatch.contract import SCHEMA_FLOOR

VERSIONS = Path(__file__).resolve().parents[3] / "migrations" / "versions"


def test_the_schema_floor_is_the_newest_migration() -> None:
    revisions = [m[1] for p in VERSIONS.glob("*.py") if (m := re.match(r"(\d{4})_", p.name))]
    assert SCHEMA_FLOOR == max(revisions), "a new migration raises SCHEMA_FLOOR with it"
