"""The fencing token of this dispatcher's writes: its dispatcher id.

Every transition and release the dispatcher sends carries its id, so a write
about a row another dispatcher holds now changes nothing. The id is known only
after registration; the parts of the database side share one :class:`Fence`
and read it when they write.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Fence:
    """This dispatcher's id (0 until registered)."""

    id: int = 0


__all__ = ["Fence"]
