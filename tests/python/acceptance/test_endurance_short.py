"""The endurance run's short mode, so CI runs it: 45 s of steady load.

RETENTION 3 s and a 2 s heartbeat, so done rows are purged and failed ones
moved to dead_letters several times within the run.

The long runs are `make endurance` (30 minutes) and `ENDURANCE_MINUTES=120
make endurance` (tests/endurance/run.py). This one is too short to judge
flatness of memory or latency, nor a table's heap (autovacuum wakes once a
minute): those verdicts are printed, not asserted here. It asserts what a
short run can: every pepsi index settles after the warm-up (failed messages
kept and moved out, done ones purged), dead_letters grows only per kept row,
the claim's and the finish's plans stay what they were, the queue drains,
and every message is accounted for.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RUN = ROOT / "tests" / "endurance" / "run.py"


def test_the_short_endurance_run_keeps_every_table_compact_and_loses_nothing() -> None:
    out = subprocess.run(
        [sys.executable, str(RUN), "--minutes", "0.75", "--warmup", "0.25", "--sample", "5"]
        + ["--window", "15", "--rate", "30", "--retention", "3", "--poll", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    text = out.stdout + out.stderr
    verdicts = [line.strip() for line in text.splitlines() if line.startswith(("  ok", "  FAIL"))]
    sizes = [
        v
        for v in verdicts
        if "size settles" in v and ("_idx" in v or "_pkey" in v or "per kept row" in v)
    ]
    assert any("workqueue_pkey" in v for v in sizes), text[-3000:]
    assert any("dead_letters" in v for v in sizes), text[-3000:]
    plans = [v for v in verdicts if "plan unchanged" in v]
    assert len(plans) == 2, text[-3000:]  # the claim's and the finish's
    judged = [*sizes, *plans, *(v for v in verdicts if "drained" in v or "enqueued:" in v)]
    assert len(judged) >= len(sizes) + 4, text[-3000:]
    assert [v for v in judged if v.startswith("FAIL")] == [], text[-3000:]
