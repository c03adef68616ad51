"""A faster jsonb loader for the SDK's connection, returning what psycopg's returns.

Every message row brings two jsonb values (payload and state), and psycopg's
default loader decodes each with ``json.loads(bytes)``, which first guesses the
encoding of the bytes. PostgreSQL sends jsonb as text in the client encoding,
and its text never starts with a byte order mark or holds a NUL, so that guess
is always UTF-8 on a UTF-8 connection. :class:`FastJsonbLoader` decodes the
bytes as UTF-8 itself (with the same error handler) and parses the text with
the decoder ``json.loads`` uses; an empty object (the usual state) is not
parsed at all. It is registered (:func:`use_fast_jsonb`) only where it returns
exactly what the default would: a UTF-8 connection whose jsonb loader is
psycopg's own, with the default ``json.loads``.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg.adapt import Loader
from psycopg.pq import Format
from psycopg.types.json import JsonbLoader

__all__ = ["FastJsonbLoader", "use_fast_jsonb"]

#: The decoder ``json.loads`` uses for text when given no options.
_decode = json.JSONDecoder().decode


class FastJsonbLoader(Loader):
    """Text jsonb to Python objects, as ``json.loads`` makes them (each call a new object)."""

    def load(self, data: Any) -> Any:
        if data == b"{}":
            return {}
        return _decode(str(data, "utf-8", "surrogatepass"))


def use_fast_jsonb(conn: psycopg.Connection) -> bool:
    """Register :class:`FastJsonbLoader` for text jsonb on ``conn`` when it would
    return the same objects as the loader in place; whether it was registered."""
    if conn.info.encoding != "utf-8":
        return False
    current = conn.adapters.get_loader(psycopg.adapters.types["jsonb"].oid, Format.TEXT)
    if current is not JsonbLoader or JsonbLoader._loads is not json.loads:
        return False  # someone chose how jsonb is loaded (set_json_loads): leave it
    conn.adapters.register_loader("jsonb", FastJsonbLoader)
    return True
