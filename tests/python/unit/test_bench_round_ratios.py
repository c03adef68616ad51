"""``peers.round_ratios``: the side-by-side bench reports each of our rows against
graphile-worker's presets round by round, with the median of those ratios."""

from __future__ import annotations

from pepsi_dispatch.devtools.bench.peers import round_ratios

PERF = "graphile-worker 0.17.3, perf preset, concurrency 8"
DEFAULT = "graphile-worker 0.17.3, default, concurrency 8"
OURS = "pepsi-dispatch, shipped defaults (SDK, PARALLELISM 4 only)"


def _row(lines: list[str], label: str) -> list[str]:
    row = next(line for line in lines if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_ratios_are_taken_within_each_round_not_between_medians() -> None:
    # Round 2 is fast for both: the medians' ratio (3000 / 2000 = 1.5) would hide
    # that we did 2× graphile's default in two of three rounds.
    results = {
        OURS: [2000.0, 6000.0, 3000.0],
        DEFAULT: [1000.0, 4000.0, 1500.0],
        PERF: [10000.0, 10000.0, 10000.0],
        "pgbench floor: one-row-update commits, 8 clients (tps)": [9000.0, 9000.0, 9000.0],
    }
    lines = round_ratios(results)
    assert lines[2] == "| system and settings | × perf | × default |"
    cells = _row(lines, OURS)
    assert cells[1] == "0.30 (0.20 / 0.60 / 0.30)"
    assert cells[2] == "2.00 (2.00 / 1.50 / 2.00)"
    # only our rows get a line: neither the peers nor the floor
    assert not any(line.startswith(("| graphile", "| pgbench")) for line in lines)


def test_only_the_references_that_ran_are_columns() -> None:
    lines = round_ratios({OURS: [3000.0], PERF: [1500.0]})
    assert lines[2] == "| system and settings | × perf |"
    assert _row(lines, OURS)[1] == "2.00 (2.00)"


def test_nothing_without_graphile() -> None:
    assert round_ratios({OURS: [3000.0], "PgQueuer 1.6, batch 100": [900.0]}) == []
