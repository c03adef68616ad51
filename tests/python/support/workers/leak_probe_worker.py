"""A stage program (the SDK's run()) whose handler looks at what its process
inherited, then leaves things behind for whoever might inherit them next.

Each message's ``msg.state["probe"]`` gets, as the handler found them before
touching anything:

* ``pid``: the worker's pid; ``message``: how many messages this process's
  handler has run before this one (module-level state);
* ``fds``: ``{fd: [readlink target, inode]}`` of every open descriptor;
* ``known``: what tells the SDK's own descriptors apart: the inode of the
  in-hand slot it mapped, the number of the connection's socket;
* ``env``: the environment variables that differ from the program's at import
  (added or changed: name -> value; removed: name -> null);
* ``seen``: the message ids this module's handlers ran before, in this process.

Then it leaves behind: an environment variable ``PEPSI_LEAK_<pid>_<id>``, a
file ``leak-<pid>-<id>`` in the directory ``--dir DIR`` left open (and
inheritable), a module-level list grown by its id.

Usage: leak_probe_worker.py --dir DIR [-c CONFIG] worker
"""

from __future__ import annotations

import os
import sys

from pepsi_dispatch.worker import Finish, Message, run

#: The environment as the program had it after import (in a template: the
#: template's, which every worker it forks starts from).
AT_IMPORT = dict(os.environ)
#: Ids whose handler ran in this process (module-level state a handler mutates).
SEEN: list[int] = []
#: Files left open by handlers (kept referenced: they stay open).
LEFT_OPEN: list[object] = []
DIR = ""


def _fds() -> dict[str, list]:
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            path = f"/proc/self/fd/{name}"
            out[name] = [os.readlink(path), os.stat(path).st_ino]
        except OSError:
            pass  # the listing's own descriptor, closed by now
    return out


def _slot_inode() -> int | None:
    """The inode of the in-hand slot this process has mapped (its own)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "memfd:pepsi-inhand" in line:
                return int(line.split()[4])
    return None


def _env() -> dict[str, str | None]:
    now = dict(os.environ)
    changed: dict[str, str | None] = {k: v for k, v in now.items() if AT_IMPORT.get(k) != v}
    changed.update({k: None for k in AT_IMPORT if k not in now})
    return changed


def probe(msg: Message):
    conn = msg.db
    msg.state["probe"] = {
        "pid": os.getpid(),
        "message": len(SEEN),
        "seen": list(SEEN),
        "fds": _fds(),
        "env": _env(),
        "known": {"slot_inode": _slot_inode(), "db": str(conn.pgconn.socket)},
    }
    # what a careless handler leaves behind
    os.environ[f"PEPSI_LEAK_{os.getpid()}_{msg.id}"] = "1"
    f = open(os.path.join(DIR, f"leak-{os.getpid()}-{msg.id}"), "w")  # noqa: SIM115
    os.set_inheritable(f.fileno(), True)
    LEFT_OPEN.append(f)
    SEEN.append(msg.id)
    return Finish()


if __name__ == "__main__":
    args = sys.argv[1:]
    i = args.index("--dir")
    DIR = args[i + 1]
    del args[i : i + 2]
    run({"a": probe}, argv=args)
