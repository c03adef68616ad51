"""The chaos soak's short run, so CI runs it: 30 s per mode with a fixed seed.

The full soak is `make chaos` (5 minutes per mode, random seed); see
tests/chaos/driver.py. This run uses a fixed seed and the fault mix below so that
it is deterministic in what it throws (timings still vary with the machine).

CI_FAULTS lists the faults this run throws. Faults left out, and why, are in
CI_EXCLUDED; re-enable them when the dispatcher fixes they wait for are merged.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DRIVER = ROOT / "tests" / "chaos" / "driver.py"
SEED = 20261130
SECONDS = 30

CI_EXCLUDED: dict[str, str] = {
    # Empty since workers' process groups are killed before their messages are
    # released and signals are caught from the command line's first lines:
    # sigterm_restart and bad_reload, left out until then, now pass.
}

CI_FAULTS = [
    "kill9_dispatcher",
    "kill9_worker",
    "kill9_child",
    "sigstop_dispatcher",
    "terminate_dispatcher_conns",
    "terminate_worker_conns",
    "pg_restart",
    "partition",
    "reload_file",
    "reload_overlay",
    "bad_reload",
    "sigterm_restart",
]


@pytest.mark.parametrize("mode", ["single", "competing"])
def test_chaos_short_run(mode: str) -> None:
    faults = [f for f in CI_FAULTS if f not in CI_EXCLUDED]
    result = subprocess.run(
        [
            sys.executable,
            str(DRIVER),
            "--mode",
            mode,
            "--seconds",
            str(SECONDS),
            "--seed",
            str(SEED),
            "--faults",
            ",".join(faults),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=SECONDS + 240,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, f"chaos soak ({mode}) failed:\n{out[-8000:]}"
    assert f"VERDICT ({mode}): PASS" in out
