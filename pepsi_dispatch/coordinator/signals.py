"""The dispatcher's signal plumbing: handlers that only set flags, and the
self-pipe (``signal.set_wakeup_fd``) that wakes the selector (invariant 11)."""

from __future__ import annotations

import os
import selectors
import signal
from collections.abc import Callable
from typing import Any

from pepsi_dispatch.coordinator import earlysignals

#: The signals the dispatcher handles: stop (INT, TERM), reload (HUP), reap (CHLD).
HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD)


class SelfPipe:
    """Installs the handlers and the wakeup pipe; restores them at the end."""

    def __init__(self) -> None:
        self._r = self._w = -1
        self._old: dict[int, Any] = {}

    def install(self, sel: selectors.BaseSelector, handler: Callable[[int, Any], None]) -> None:
        """``handler`` must only set flags: it runs between bytecodes of the loop.

        Signals that came before (``earlysignals``, recorded from the command line's first lines) go
        to ``handler`` now, and the first select returns at once: an early SIGHUP
        is a reload, an early SIGINT/SIGTERM a stop before start-up."""
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        sel.register(self._r, selectors.EVENT_READ, lambda now: self.drain())
        for sig in HANDLED:
            self._old[sig] = signal.signal(sig, handler)
        early = earlysignals.take()
        for sig, count in early.items():
            for _ in range(count):
                handler(sig, None)
        if early:
            os.write(self._w, b"\0")

    def restore(self) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(-1)
        for fd in (self._r, self._w):
            if fd >= 0:
                os.close(fd)

    def drain(self) -> None:
        """Empty the pipe (the flags tell what happened)."""
        try:
            while os.read(self._r, 4096):
                pass
        except BlockingIOError:
            pass


__all__ = ["HANDLED", "SelfPipe"]
