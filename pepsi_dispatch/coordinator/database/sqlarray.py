"""Array parameters for the dispatcher's SQL calls (calls.py)."""

from __future__ import annotations

from collections.abc import Iterable


def int_array(values: Iterable[int | None]) -> str:
    """A bigint[]/int[] parameter as its text literal ``{1,2,NULL}``: psycopg's list
    dumper costs ~1.7 µs of CPU per element (110 µs for 64 ids, measured), the
    join ~0.1 µs; every such parameter here is cast (``%s::bigint[]``)."""
    vals = list(values)
    if None in vals:
        return "{" + ",".join("NULL" if v is None else str(int(v)) for v in vals) + "}"
    return "{" + ",".join(map(str, map(int, vals))) + "}"
