"""The bench's per-message function counts (devtools/bench/funcstats.py): what
ran between two snapshots of ``pg_stat_user_functions``, and the line printed."""

from __future__ import annotations

from pepsi_dispatch.devtools.bench.funcstats import Calls, delta, line


def test_delta_keeps_only_what_ran_and_subtracts() -> None:
    before = {"claim_lines": Calls(10, 2.0), "finish_many": Calls(5, 1.0), "idle": Calls(3, 0.5)}
    after = {
        "claim_lines": Calls(30, 6.5),
        "finish_many": Calls(5, 1.0),  # did not run
        "idle": Calls(3, 0.5),
        "pin_messages": Calls(7, 0.7),  # first seen after
    }
    assert delta(before, after) == {"claim_lines": Calls(20, 4.5), "pin_messages": Calls(7, 0.7)}


def test_line_is_per_message_busiest_first() -> None:
    ran = {"pin_messages": Calls(250, 15.0), "claim_lines": Calls(172, 40.0)}
    text = line(ran, 1000)
    assert text.index("claim_lines") < text.index("pin_messages")
    # 172 calls over 1000 messages; 40 ms own time is 40 µs a message, 233 µs a call
    assert "claim_lines 0.172 calls, 40 µs (233 µs a call)" in text
    assert "pin_messages 0.250 calls, 15 µs (60 µs a call)" in text


def test_line_caps_the_list_and_says_when_nothing_was_counted() -> None:
    ran = {f"f{i}": Calls(1, float(i)) for i in range(10)}
    text = line(ran, 10, top=3)
    assert "f9" in text and "f7" in text and "f6" not in text
    assert line({}, 100).endswith("none counted")
    assert line(ran, 0).endswith("none counted")
