"""Faster adapters for the SDK's connection: jsonb in, message id arrays out.

**jsonb** (:class:`FastJsonbLoader`): every message row brings two jsonb
values (payload and state), and psycopg's default loader decodes each with
``json.loads(bytes)``, which first guesses the encoding of the bytes.
PostgreSQL sends jsonb as text in the client encoding, and its text never
starts with a byte order mark or holds a NUL, so that guess is always UTF-8 on
a UTF-8 connection. :class:`FastJsonbLoader` decodes the
bytes as UTF-8 itself (with the same error handler) and parses the text with
the decoder ``json.loads`` uses (its ``raw_decode``, falling back on
``decode`` unless the text is exactly one value); an empty object (the usual
state) is not parsed at all. It is registered (:func:`use_fast_jsonb`) only where it returns
exactly what the default would: a UTF-8 connection whose jsonb loader is
psycopg's own, with the default ``json.loads``.

**id arrays** (:class:`Ids`): a batch's ids go out as one ``bigint[]``
(``get_messages``, ``finish_many``, ``advance_many``). psycopg dumps a list
element by element, choosing each one's type and quoting; :class:`IdsDumper`
writes the array's text in one join. An :class:`Ids` is a list, so on a
connection without the dumper psycopg dumps it as any list.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg.adapt import Dumper, Loader
from psycopg.pq import Format
from psycopg.types.json import JsonbLoader

__all__ = ["FastJsonbLoader", "Ids", "IdsDumper", "use_fast_adapters", "use_fast_jsonb"]

#: The decoder ``json.loads`` uses for text when given no options.
_DECODER = json.JSONDecoder()
_decode = _DECODER.decode
_raw_decode = _DECODER.raw_decode


class FastJsonbLoader(Loader):
    """Text jsonb to Python objects, as ``json.loads`` makes them (each call a new object)."""

    def load(self, data: Any) -> Any:
        if data == b"{}":
            return {}
        text = str(data, "utf-8", "surrogatepass")
        # decode() is raw_decode() after and before skipping whitespace, which
        # PostgreSQL's jsonb text has none of: without it, raw_decode() alone.
        try:
            value, end = _raw_decode(text)
        except ValueError:
            return _decode(text)  # leading whitespace, or bad text: decode() tells
        if end != len(text):
            return _decode(text)  # trailing whitespace or extra data: the same
        return value


class Ids(list[int]):
    """Message ids, sent as one ``bigint[]`` (by :class:`IdsDumper` where registered)."""


class IdsDumper(Dumper):
    """An :class:`Ids` as the text of a ``bigint[]``: ``{1,2,3}``."""

    oid = psycopg.adapters.types["int8"].array_oid

    def dump(self, obj: Any) -> bytes:
        # int.__repr__: what is not an int raises, as it would in the server's cast
        return ("{" + ",".join(map(int.__repr__, obj)) + "}").encode()


def use_fast_adapters(conn: psycopg.Connection) -> None:
    """Register the adapters above on ``conn`` (jsonb only where :func:`use_fast_jsonb` may)."""
    conn.adapters.register_dumper(Ids, IdsDumper)
    use_fast_jsonb(conn)


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
