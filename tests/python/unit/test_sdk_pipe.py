"""Unit tests of the SDK (no database): the pipe: the line reader, ids, answers and reasons."""

from __future__ import annotations

import os

from pepsi_dispatch.sdk.pipe import (
    MAX_REASON,
    LineReader,
    exc_reason,
    one_line,
    parse_id,
    write_answers,
)


def test_one_line_and_exc_reason() -> None:
    assert one_line("a\n  b\tc") == "a b c"
    assert one_line("  ") == "failed"
    long = one_line("x" * (MAX_REASON + 10))
    assert len(long) == MAX_REASON and long.endswith("...")
    assert exc_reason(ValueError("bad\nvalue")) == "ValueError: bad value"
    assert exc_reason(KeyError()) == "KeyError"


def test_parse_id() -> None:
    assert parse_id(b" 42 \n") == 42
    assert parse_id(b"x") is None


def test_line_reader_batches_what_is_buffered_and_reads_a_last_line_at_eof() -> None:
    r, w = os.pipe()
    calls: list[str] = []
    reader = LineReader(r, lambda: calls.append("before"), lambda: calls.append("after"))
    os.write(w, b"1\n\n2\n3")
    assert reader.lines() == [b"1", b"2"]
    assert calls == ["before", "after"]
    os.write(w, b"4\n")
    assert reader.lines() == [b"34"]
    os.close(w)
    assert reader.lines() == []
    os.close(r)


def test_line_reader_unterminated_last_line_counts_at_eof() -> None:
    r, w = os.pipe()
    reader = LineReader(r, lambda: None, lambda: None)
    os.write(w, b"5")
    os.close(w)
    assert reader.lines() == [b"5"]
    assert reader.lines() == []
    os.close(r)


def test_write_answers() -> None:
    r, w = os.pipe()
    write_answers(w, ["0", "1 no"])
    assert os.read(r, 100) == b"0\n1 no\n"
    os.close(r)
    os.close(w)


def test_line_reader_ready_never_blocks_and_keeps_a_partial_line() -> None:
    r, w = os.pipe()
    reader = LineReader(r, lambda: None, lambda: None)
    assert reader.ready() == []  # nothing written: returns at once
    os.write(w, b"1\n2\n3")
    assert reader.ready() == [b"1", b"2"]
    os.write(w, b"\n")
    assert reader.ready() == [b"3"]
    os.close(w)
    os.close(r)
