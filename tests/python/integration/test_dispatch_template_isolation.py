"""Workers forked by one stage's template share nothing with each other: no
descriptor, no environment change, no module-level state. Each starts from
the template as it was after import (sdk/template.py, sdk/lending.py), with
the real dispatcher, real forked workers and a real PostgreSQL.

The stage program is tests/python/support/workers/leak_probe_worker.py: its
handler records what its process has open and what its environment and
module state are, then leaves a file open, an environment variable set and
a module-level list grown for whoever might inherit them.
"""

from __future__ import annotations

import re
from collections import Counter

from dispatch_harness import PYTHON, ROOT, Harness, harness_fixture  # noqa: F401

PROBE = ROOT / "tests/python/support/workers/leak_probe_worker.py"
FORKED = re.compile(r"worker pid (\d+) forked by the stage's template")
LEAK = re.compile(r"leak-(\d+)-\d+$")

#: What a forked SDK worker has open at its first message, by kind: stdin
#: (/dev/null) and stdout/stderr (the stderr pipe), the protocol's stdin and
#: stdout moved aside, sys.stdin (/dev/null), the in-hand slot (its mapping's
#: descriptor), its database connection and the template's return socket for
#: the session it gives back.
DOCUMENTED = Counter({"pipe": 4, "/dev/null": 2, "memfd": 1, "socket": 2})
#: A worker the dispatcher exec'd itself (no template ready yet, or the template
#: was given up on a loaded machine) has no template to give a session back to.
EXECED = DOCUMENTED - Counter({"socket": 1})


def _kind(target: str) -> str:
    for kind in ("pipe", "socket", "memfd"):
        if target.startswith((f"{kind}:", f"/{kind}:")):
            return kind
    return target


def test_workers_forked_from_one_template_inherit_nothing_from_each_other(h: Harness) -> None:
    """PARALLELISM 2 and MAX_MESSAGES 2: workers are recycled through the
    template while a sibling works (and holds a session the template lent it).
    Each worker's first message finds exactly the documented descriptors, its
    own; no file, environment variable or module-level state an earlier or
    sibling worker's handler left; its pipes and slot are its own."""
    program = f"{PYTHON} {PROBE} --dir {h.tmp}"
    stages = {"a": {"PROGRAM": program, "PARALLELISM": 2, "QUEUE_LIMIT": 1, "MAX_MESSAGES": 2}}
    conf = h.conf(stages, CONFIG_FILE=str(h.tmp / "pepsi.conf"), WORKER_IDLE_TIMEOUT="60 s")
    d = h.start(conf)
    ids = h.enqueue("a", 16)
    assert h.wait_all(timeout=60) == {"done": 16}
    probes = [h.row(i)["state"]["probe"] for i in ids]
    forked = {int(pid) for pid in FORKED.findall(d.log())}
    by_pid: dict[int, list[dict]] = {}
    for probe in probes:
        by_pid.setdefault(probe["pid"], []).append(probe)
    assert len(set(by_pid) & forked) >= 6, (sorted(by_pid), sorted(forked), d.tail())

    firsts = {pid: min(seen, key=lambda p: p["message"]) for pid, seen in by_pid.items()}
    owner: dict[int, int] = {}  # inode of a pipe or slot -> the worker that had it
    return_sockets = set()
    for pid, first in firsts.items():
        fds = {int(fd): (target, inode) for fd, (target, inode) in first["fds"].items()}
        kinds = Counter(_kind(target) for target, _ in fds.values())
        assert kinds == (DOCUMENTED if pid in forked else EXECED), (pid, pid in forked, fds)
        assert first["message"] == 0 and first["seen"] == [], first
        db = int(first["known"]["db"])
        assert _kind(fds[db][0]) == "socket", (pid, fds)
        for fd, (target, inode) in fds.items():
            if _kind(target) == "socket" and fd != db:
                assert pid in forked, (pid, fds)
                return_sockets.add(inode)
            if _kind(target) in ("pipe", "memfd"):
                assert owner.setdefault(inode, pid) == pid, (pid, fd, target, owner[inode])
        slots = [inode for target, inode in fds.values() if _kind(target) == "memfd"]
        assert slots == [first["known"]["slot_inode"]], (pid, fds)
    assert len(return_sockets) == 1, return_sockets  # the one template's, in every worker

    for probe in probes:
        pid = probe["pid"]
        own = {i for p in by_pid[pid] for i in [*p["seen"]]}
        assert set(probe["seen"]) <= own, probe  # module state: its own messages only
        assert probe["message"] == len(probe["seen"]), probe
        left = [LEAK.search(target) for target, _ in probe["fds"].values()]
        assert {int(m.group(1)) for m in left if m} <= {pid}, probe  # files: its own only
        env = probe["env"]
        foreign = [k for k in env if k.startswith("PEPSI_LEAK_") and f"_{pid}_" not in k]
        assert foreign == [], probe
        assert {k for k in env if not k.startswith("PEPSI_LEAK_")} <= {
            "PEPSI_INHAND_FD",  # read and removed by the SDK (sdk/inhand.py)
            "PEPSI_TEMPLATE_OFFER_FD",  # taken by the first worker (the template's offer)
        }, probe
    assert d.terminate() == 0
