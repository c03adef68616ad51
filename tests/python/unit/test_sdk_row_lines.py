"""Unit tests of the SDK (no database): row lines on the pipe (CAN_TAKE_ROWS).

A line ``ID<TAB>STAGE<TAB>RETRIES<TAB>PAYLOAD<TAB>STATE`` brings its row; a
bare id is loaded with pepsi.get_messages as before; after a lost connection
(``use_lines=False``) every row is loaded again.
"""

from __future__ import annotations

import json

from sdk_fakes import RowsConn

from pepsi_dispatch.sdk.loading import GET_MESSAGES, load_batch, parse_ids, rows_on_lines
from pepsi_dispatch.sdk.pipe import parse_id

PAYLOAD = {"text": "tab\there\nnewline", "ü": "ñ", "n": [1, 2.5, None]}


def row_line(
    wq_id: int, payload: object = PAYLOAD, state: object = None, retries: int = 2
) -> bytes:
    fields = [str(wq_id), "a", str(retries), json.dumps(payload), json.dumps(state or {})]
    return "\t".join(fields).encode()


def test_the_id_of_a_row_line_is_its_first_field() -> None:
    assert parse_id(row_line(12)) == 12
    assert parse_id(b"12") == 12
    assert parse_id(b" 12 ") == 12
    assert parse_id(b"x\t1\t2\t{}\t{}") is None
    assert parse_id(b"") is None


def test_a_row_line_brings_its_row() -> None:
    lines = [row_line(7, state={"k": 1}), b"8"]
    rows = rows_on_lines(RowsConn(), lines, parse_ids(lines))  # type: ignore[arg-type]
    assert rows == {7: (7, "a", "running", PAYLOAD, {"k": 1}, 2)}


def test_a_line_that_does_not_parse_brings_no_row() -> None:
    lines = [b"7\ta\t0\t{}", b"8\ta\tzero\t{}\t{}", b"9\ta\t0\t{not json\t{}"]
    assert rows_on_lines(RowsConn(), lines, parse_ids(lines)) == {}  # type: ignore[arg-type]


def test_only_bare_ids_are_loaded() -> None:
    conn = RowsConn()
    lines = [row_line(7), b"8", row_line(9), b"junk"]
    loaded = load_batch(conn, lines)  # type: ignore[arg-type]
    assert conn.log == [(GET_MESSAGES, ([8],))]
    assert [(item.message_id, item.row) for item in loaded] == [
        (7, (7, "a", "running", PAYLOAD, {}, 2)),
        (8, (8, "a", "running", {}, {}, 0)),
        (9, (9, "a", "running", PAYLOAD, {}, 2)),
        (None, None),
    ]


def test_no_round_trip_when_every_line_brings_its_row() -> None:
    conn = RowsConn()
    loaded = load_batch(conn, [row_line(7), row_line(9)])  # type: ignore[arg-type]
    assert conn.log == []
    assert [item.message_id for item in loaded] == [7, 9]


def test_after_a_lost_connection_every_row_is_loaded_again() -> None:
    conn = RowsConn()
    loaded = load_batch(conn, [row_line(7), b"8"], use_lines=False)  # type: ignore[arg-type]
    assert conn.log == [(GET_MESSAGES, ([7, 8],))]
    assert loaded[0].row == (7, "a", "running", {}, {}, 0), "the database's row, not the line's"


def test_a_second_copy_of_an_id_is_read_again_at_its_turn() -> None:
    conn = RowsConn()
    loaded = load_batch(conn, [row_line(7), row_line(7)])  # type: ignore[arg-type]
    assert loaded[0].row is not None and loaded[0].row[0] == 7
    assert loaded[1].row == ("reload",)


def test_the_worker_asks_for_rows_on_its_lines_only_once_it_knows_it_will_not_pin(
    tmp_path, monkeypatch
) -> None:
    """Mapping the slot says "can be a template" and nothing more: a worker that
    pins its rows reads each of them again, so rows on its lines would cost the
    dispatcher their rendering for nothing. take_rows() adds CAN_TAKE_ROWS,
    keeping the other bits; without a slot it does nothing."""
    import os
    import struct

    from pepsi_dispatch.contract import CAN_TAKE_ROWS, CAN_TEMPLATE, INHAND_ENV, INHAND_WORD
    from pepsi_dispatch.sdk.inhand import InHand, from_environment

    slot = tmp_path / "slot"
    slot.write_bytes(bytes(16))
    fd = os.open(slot, os.O_RDWR)
    monkeypatch.setenv(INHAND_ENV, str(fd))
    in_hand = from_environment()  # closes fd

    def caps() -> int:
        return struct.unpack("=" + INHAND_WORD.lstrip("=@") * 2, slot.read_bytes())[1]

    assert caps() == CAN_TEMPLATE
    in_hand.take_rows()
    assert caps() == CAN_TEMPLATE | CAN_TAKE_ROWS
    InHand(None).take_rows()  # no slot: nothing to say, no error
