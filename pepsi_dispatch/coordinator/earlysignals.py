"""Stop and reload signals that arrive before the event loop installs its handlers.

``pepsi-dispatch`` spends its first fraction of a second importing, loading the
configuration, setting up logging and dropping privileges. A SIGHUP or SIGTERM
in that window used to kill it by the signal (exit -1 / -15): a service
manager's reload right after a start became a crash. :func:`install` (first
thing in :func:`pepsi_dispatch.cli.dispatch.main`) replaces the default actions by
flag-setting handlers; the loop takes the flags over when it installs its own
handlers (:func:`take`): an early SIGHUP is a reload, an early SIGINT/SIGTERM a
clean stop (exit 0).

What remains is the interpreter's own start-up and the import of the CLI module
(tens of milliseconds), which no Python code can cover.
"""

from __future__ import annotations

import signal
from typing import Any

__all__ = ["SIGNALS", "install", "restore", "take"]

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_pending: dict[int, int] = {}


def _note(signum: int, frame: object) -> None:
    # Only sets a flag: runs between bytecodes of whatever is starting up.
    _pending[signum] = _pending.get(signum, 0) + 1


def install() -> dict[int, Any]:
    """Record SIGINT/SIGTERM/SIGHUP instead of dying by them; returns the old handlers."""
    _pending.clear()
    return {sig: signal.signal(sig, _note) for sig in SIGNALS}


def restore(old: dict[int, Any]) -> None:
    """Put back the handlers :func:`install` returned (main() returns, e.g. in tests)."""
    for sig, handler in old.items():
        signal.signal(sig, handler)
    _pending.clear()


def take() -> dict[int, int]:
    """The signals recorded so far (signal -> count), forgetting them."""
    out = dict(_pending)
    _pending.clear()
    return out
