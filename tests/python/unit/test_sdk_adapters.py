"""Unit tests of the SDK (no database): the fast adapters give what psycopg's give."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from psycopg import adapters
from psycopg.adapt import AdaptersMap, PyFormat
from psycopg.pq import Format
from psycopg.types.json import JsonbLoader, set_json_loads

from pepsi_dispatch.sdk.adapters import (
    FastJsonbLoader,
    Ids,
    IdsDumper,
    use_fast_adapters,
    use_fast_jsonb,
)

JSONB = adapters.types["jsonb"].oid

#: jsonb text as PostgreSQL prints it: empty, flat, nested, escapes, non-ASCII, scalars.
SAMPLES = [
    b"{}",
    b"[]",
    b'{"n": 1}',
    b'{"a": 1.0, "b": 1, "c": 1e400, "d": -0.0, "e": 12345678901234567890}',
    b'{"x": {"y": [1, {"z": null}, true, false, "s"]}, "k": {}}',
    b'{"q": "tab\\t nl\\n quote\\" slash\\\\ u\\u0041 lone\\ud800"}',
    '{"é": "日本語 ☃ 😀"}'.encode(),
    b'"text"',
    b"42",
    b"3.5",
    b"true",
    b"null",
    b' {"padded": [1, 2]} \n',  # never sent by PostgreSQL: whitespace around a value
    b"\t7",
]


def typed(value: Any) -> Any:
    """``value`` with the type of every part spelled out (1 and 1.0 differ, order counts)."""
    if isinstance(value, dict):
        return ("dict", [(k, typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [typed(v) for v in value])
    return (type(value).__name__, repr(value))


@pytest.mark.parametrize("text", SAMPLES)
@pytest.mark.parametrize("wrap", [bytes, memoryview])
def test_fast_loader_returns_the_objects_psycopg_returns(text: bytes, wrap: type) -> None:
    fast = FastJsonbLoader(JSONB).load(wrap(text))
    assert typed(fast) == typed(JsonbLoader(JSONB).load(wrap(text)))
    assert typed(fast) == typed(json.loads(text))


def test_the_comparison_tells_different_objects_apart() -> None:
    """The check above would catch a loader that got types or order wrong."""
    assert typed({"a": 1}) != typed({"a": 1.0})
    assert typed({"a": 1, "b": 2}) != typed({"b": 2, "a": 1})
    assert typed({"a": [1]}) != typed({"a": (1,)})
    assert typed({}) != typed([])


def test_each_empty_object_is_a_new_dict() -> None:
    loader = FastJsonbLoader(JSONB)
    first, second = loader.load(b"{}"), loader.load(memoryview(b"{}"))
    first["k"] = 1
    assert second == {} and first is not second


def test_bad_text_raises_as_psycopg_does() -> None:
    for text in (b"{", b'{"a": \xff}', b'{"a": 1} {"b": 2}', b"", b" ", b"[1,]"):
        with pytest.raises(ValueError) as expected:
            JsonbLoader(JSONB).load(text)
        with pytest.raises(type(expected.value)) as got:
            FastJsonbLoader(JSONB).load(text)
        assert str(got.value) == str(expected.value)


def fake_conn(encoding: str = "utf-8") -> Any:
    return SimpleNamespace(info=SimpleNamespace(encoding=encoding), adapters=AdaptersMap(adapters))


def test_registered_on_a_utf8_connection_with_the_default_loader() -> None:
    conn = fake_conn()
    assert use_fast_jsonb(conn)
    assert conn.adapters.get_loader(JSONB, Format.TEXT) is FastJsonbLoader
    assert adapters.get_loader(JSONB, Format.TEXT) is JsonbLoader  # only that connection


def test_not_registered_where_it_could_differ() -> None:
    conn = fake_conn("latin-1")
    assert not use_fast_jsonb(conn)
    assert conn.adapters.get_loader(JSONB, Format.TEXT) is JsonbLoader
    conn = fake_conn()
    set_json_loads(lambda data: "custom", conn)  # a choice made for this connection
    assert not use_fast_jsonb(conn)
    conn = fake_conn()
    set_json_loads(lambda data: "custom")  # a choice made for every connection
    try:
        assert not use_fast_jsonb(conn)
    finally:
        set_json_loads(json.loads)


def test_ids_are_dumped_as_the_text_of_one_bigint_array() -> None:
    dumper = IdsDumper(Ids)
    assert dumper.oid == adapters.types["int8"].array_oid
    assert dumper.dump(Ids([1, 22, 2**62])) == b"{1,22,4611686018427387904}"
    assert dumper.dump(Ids([])) == b"{}"
    assert Ids([1, 2]) == [1, 2]  # still a list where no dumper is registered
    with pytest.raises(TypeError):
        dumper.dump(Ids(["1; drop"]))  # type: ignore[list-item]


def test_fast_adapters_register_the_ids_dumper_on_that_connection_only() -> None:
    conn = fake_conn()
    use_fast_adapters(conn)
    assert conn.adapters.get_dumper(Ids, PyFormat.TEXT) is IdsDumper
    assert conn.adapters.get_loader(JSONB, Format.TEXT) is FastJsonbLoader
    assert adapters.get_dumper(Ids, PyFormat.TEXT) is not IdsDumper
