"""Rows on the pipe: a worker that says it takes them (CAN_TAKE_ROWS in its
in-hand slot) is handed each claimed row as one line, ID, STAGE, RETRIES,
PAYLOAD and STATE separated by tabs, instead of the bare id; every other
worker is handed bare ids, as the plain protocol says.

The stage program is the scripted worker (tests/python/support/workers), which
logs every row line it reads (ROW <id> <pid> <hex>).
"""

from __future__ import annotations

import json

import pytest
from dispatch_harness import (  # noqa: F401
    Harness,
    harness_fixture,
)

from pepsi_dispatch.contract import ROW_LINE_MAX

ODD = {"text": 'tab\there\nnewline "quoted" \\ back', "ü": "ñ 漢字", "list": [1, 2.5, None]}


def _row_lines(h: Harness) -> dict[int, list[str]]:
    """The row lines each id was handed as, split at the tabs."""
    out: dict[int, list[str]] = {}
    for line in h.worker_log.read_text().splitlines():
        words = line.split()
        if words[:1] == ["ROW"]:
            out.setdefault(int(words[1]), []).append(bytes.fromhex(words[3]).decode())
    return {i: lines[-1].split("\t") for i, lines in out.items()}


def _received(h: Harness) -> set[int]:
    return {
        int(w[1])
        for w in (line.split() for line in h.worker_log.read_text().splitlines())
        if w[:1] == ["RECV"]
    }


def test_a_worker_that_takes_rows_reads_each_claimed_row_on_its_line(h: Harness) -> None:
    conf = h.conf({"a": {"PROGRAM": h.program() + " --take-rows", "PARALLELISM": 1}})
    h.start(conf)
    # The first batch goes out before the worker has said what it takes: bare ids.
    first = h.enqueue("a", 1)
    h.wait_all()
    payloads = [ODD, {"n": 2}, {"big": "x" * ROW_LINE_MAX}, {}]
    ids = h.enqueue("a", payloads)
    counts = h.wait_all()
    assert counts == {"done": 5}, counts
    rows = _row_lines(h)
    assert first[0] not in rows
    assert set(ids) <= _received(h)
    big = ids[2]
    assert big not in rows, "a row longer than ROW_LINE_MAX goes out as the bare id"
    for wq_id, payload in zip(ids, payloads, strict=True):
        if wq_id == big:
            continue
        assert wq_id in rows, f"message {wq_id} came as a bare id: {h.worker_log.read_text()}"
        fields = rows[wq_id]
        assert len(fields) == 5, fields
        assert int(fields[0]) == wq_id
        assert fields[1] == "a"
        assert int(fields[2]) == 0
        assert json.loads(fields[3]) == payload
        assert json.loads(fields[4]) == {}


def test_a_worker_that_does_not_take_rows_reads_bare_ids(h: Harness) -> None:
    conf = h.conf({"a": {"PROGRAM": h.program(), "PARALLELISM": 2, "QUEUE_LIMIT": 4}})
    h.start(conf)
    ids = h.enqueue("a", [ODD] * 20)
    assert h.wait_all() == {"done": 20}
    assert set(ids) <= _received(h)
    assert _row_lines(h) == {}, "a worker that did not ask for rows was sent one"


def test_a_retried_message_comes_with_its_retries_and_state(h: Harness) -> None:
    conf = h.conf(
        {
            "a": {
                "PROGRAM": h.program() + " --take-rows",
                "PARALLELISM": 1,
                "RETRY_DELAY": "1 s",
                "MAX_RETRIES": 3,
            }
        }
    )
    h.start(conf)
    h.enqueue("a", 1)  # the worker starts and says it takes rows
    h.wait_all()
    (wq_id,) = h.enqueue("a", [{"do": "until:1:fail"}])
    assert h.wait_all(timeout=60) == {"done": 2}
    fields = _row_lines(h)[wq_id]
    assert int(fields[2]) == 1, fields
    state = json.loads(fields[4])
    assert "retry_error" in state, state
    assert h.row(wq_id)["retries"] == 1


SDK_WORKER = "tests/python/support/workers/sdk_scripted_worker.py"


def _function_calls(h: Harness, name: str) -> int:
    h.conn.execute("SELECT pg_stat_clear_snapshot()")
    row = h.conn.execute(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions"
        " WHERE schemaname = 'pepsi' AND funcname = %s",
        (name,),
    ).fetchone()
    return int(row[0])


@pytest.mark.parametrize("pinning", [False, True], ids=["row-lines", "pinned"])
def test_sdk_handlers_see_the_same_message_from_a_row_line(h: Harness, pinning: bool) -> None:
    """The SDK takes rows on its pipe when it does not pin them (here: a database
    without pepsi.pin_messages); a pinning worker reads each row again with its
    pin and asks for bare ids. Either way its handlers see payload, retries,
    stage and state exactly as stored (odd strings, a retried message), a
    payload too long for a line is read from the database, and the batches
    cost no pepsi.get_messages call."""
    from dispatch_harness import PYTHON, ROOT, wait_until

    h.conn.execute(f"ALTER DATABASE {h.conn.info.dbname} SET track_functions = 'all'")
    if not pinning:
        h.conn.execute("ALTER FUNCTION pepsi.pin_messages(bigint[], bigint) RENAME TO pin_off")
    program = f"{PYTHON} {ROOT / SDK_WORKER} --stages a"
    conf = h.conf(
        {"a": {"PROGRAM": program, "PARALLELISM": 1, "QUEUE_LIMIT": 4, "RETRY_DELAY": "1 s"}}
    )
    d = h.start(conf)
    h.enqueue("a", [{"plan": {"a": {"op": "finish"}}}])  # the worker starts, says it takes rows
    h.wait_all()
    echo = {"op": "finish", "echo": True}
    payloads = [
        {"plan": {"a": echo}, "odd": ODD},
        {"plan": {"a": echo}, "big": "y" * ROW_LINE_MAX},
        {"plan": {"a": {"op": "raise", "message": "once", "below": 1, "echo": True}}},
        *({"plan": {"a": echo}, "n": n} for n in range(40)),
    ]
    ids = h.enqueue("a", payloads)
    assert h.wait_all(timeout=90) == {"done": len(ids) + 1}
    for wq_id, payload in zip(ids, payloads, strict=True):
        row = h.row(wq_id)
        seen = row["state"]["echo"]
        assert seen["payload"] == payload, (wq_id, seen)
        assert seen["stage"] == "a"
        assert seen["retries"] == row["retries"]
    retried = h.row(ids[2])
    assert retried["retries"] == 1
    assert "retry_error" in retried["state"]["echo"]["state"], retried["state"]
    # Backends report their function calls when they end: stop the service.
    assert d.terminate() == 0
    # (A handler that changes msg.state finishes with set_state and finish.)
    wait_until(lambda: _function_calls(h, "finish") >= len(ids), 20, 0.2, lambda: "no stats")
    loads = _function_calls(h, "get_messages")
    # Without rows on the pipe: one call per batch, at least 43 / 4 of them.
    assert loads <= 4, f"{loads} pepsi.get_messages calls for {len(ids) + 1} messages"
    if pinning:
        assert _function_calls(h, "pin_messages") >= (len(ids) + 1) / 4
