"""The bench gives up on a drain whose workers cannot start, with the
dispatcher's own words, instead of waiting for the whole --timeout."""

from __future__ import annotations

import time

import pytest

from pepsi_dispatch.devtools.bench import core

BROKEN_WORKER = "#!/bin/sh\necho 'cannot start: no module named handlers' >&2\nexit 3\n"


def test_a_drain_whose_workers_cannot_start_stops_early(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core, "STALL_AFTER", 4.0)
    monkeypatch.setattr(core, "SDK_WORKER", BROKEN_WORKER)
    began = time.monotonic()
    with pytest.raises(SystemExit) as stopped:
        core.throughput(dsn, "sdk-default", 50, 1, 2, 4, timeout=120)
    took = time.monotonic() - began
    assert took < 60, f"waited {took:.0f} s"
    said = str(stopped.value)
    assert "no stage run finished in 4 s" in said, said
    assert "cannot start: no module named handlers" in said, said


def test_a_drain_that_moves_is_not_stopped(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core, "STALL_AFTER", 4.0)
    result = core.throughput(dsn, "sdk-default", 300, 1, 2, 4, timeout=120)
    assert result["failed"] == 0
    assert result["stage_runs"] == 300
