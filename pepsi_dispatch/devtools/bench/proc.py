"""CPU seconds of processes and their trees, from /proc (the benchmark's meters)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["proc_cpu", "tree_cpu"]

_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> tuple[float, float]:
    """(own, reaped children) CPU seconds of ``pid`` from /proc (0, 0 if gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    own = (int(fields[11]) + int(fields[12])) / _TCK
    reaped = (int(fields[13]) + int(fields[14])) / _TCK
    return own, reaped


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                out.append(int(d.name))
    return out


def tree_cpu(pid: int) -> tuple[float, float]:
    """(own, whole tree) CPU seconds of ``pid``: itself; plus reaped and live descendants."""
    own, reaped = proc_cpu(pid)
    total = own + reaped
    for child in _children(pid):
        total += tree_cpu(child)[1]
    return own, total
