"""Unit test of the endurance run's plan shapes (tests/endurance/plans.py): no database."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "endurance"))
import plans  # noqa: E402


def _update(scan: dict) -> dict:
    return {"Node Type": "ModifyTable", "Relation Name": "workqueue", "Plans": [scan]}


BITMAP = _update(
    {
        "Node Type": "Bitmap Heap Scan",
        "Relation Name": "workqueue",
        "Plans": [{"Node Type": "Bitmap Index Scan", "Index Name": "workqueue_pkey"}],
    }
)
PLAIN = _update(
    {
        "Node Type": "Index Scan",
        "Relation Name": "workqueue",
        "Index Name": "workqueue_pkey",
        "Scan Direction": "Forward",
    }
)


def test_a_plain_and_a_bitmap_read_of_one_index_are_one_shape() -> None:
    """A generic plan of finish_many flipped between the two as autovacuum's
    statistics changed (seen in a 2-hour run): the same access path."""
    assert plans.shape(BITMAP) == plans.shape(PLAIN)


def test_a_seq_scan_or_another_index_is_another_shape() -> None:
    seq = _update({"Node Type": "Seq Scan", "Relation Name": "workqueue"})
    other = _update({**PLAIN["Plans"][0], "Index Name": "workqueue_done_idx"})
    assert len({plans.shape(PLAIN), plans.shape(seq), plans.shape(other)}) == 3
