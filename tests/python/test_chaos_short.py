"""The chaos soak's short run (issue 8), so CI runs it: 30 s per mode with a fixed seed.

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

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "chaos" / "driver.py"
SEED = 20261130
SECONDS = 30

CI_EXCLUDED: dict[str, str] = {
    # Both stop a dispatcher gracefully. Today (4cc6518) the shell wrapper of stage b
    # dies on SIGTERM while its child one.sh runs on, and the dispatcher releases the
    # child's message at once: the restarted dispatcher (single mode) or another
    # replica (competing) runs it again while the orphan still runs it (issue 8,
    # hole 3; seen in the 5-minute soak, seed 8). In competing mode a graceful stop
    # longer than ORPHAN_TIMEOUT also lets another replica rerun messages (hole 2).
    # Re-enable both once the process-group fix is merged.
    "sigterm_restart": "graceful stop orphans the wrapper's child: issue 8 holes 3 and 2",
    "bad_reload": "exit 1 after a bad reload is a graceful stop too: issue 8 holes 3 and 2",
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
