"""systemd's notify protocol (sd_notify(3)), without libsystemd.

A service of ``Type=notify`` gets ``NOTIFY_SOCKET``: a Unix datagram socket,
a path or (leading ``@``) an abstract name. Each message is one datagram of
``KEY=VALUE`` lines. The dispatcher sends ``READY=1`` once it holds the
database lock, ``STOPPING=1`` when it begins to shut down, and ``WATCHDOG=1``
every half ``WATCHDOG_USEC`` while its loop runs (``WatchdogSec=``). Without
``NOTIFY_SOCKET`` every call is a no-op.
"""

from __future__ import annotations

import logging
import os
import socket

from pepsi_dispatch.contract import INF

__all__ = ["SystemdWatchdog", "notify"]

log = logging.getLogger(__name__)


def notify(state: str, environ: dict[str, str] | None = None) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``) to ``$NOTIFY_SOCKET``; False if not sent."""
    env = os.environ if environ is None else environ
    address = env.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    elif not address.startswith("/"):
        log.debug("NOTIFY_SOCKET %r is neither a path nor '@name': not notifying", address)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        log.warning("cannot notify systemd (%s) of %r: %s", env.get("NOTIFY_SOCKET"), state, exc)
        return False
    return True


class SystemdWatchdog:
    """``WATCHDOG=1`` at half the interval systemd asked for (``WATCHDOG_USEC``)."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._env = env
        self.interval = 0.0  # seconds between pings; 0 = no watchdog
        pid = env.get("WATCHDOG_PID", "")
        try:
            usec = int(env.get("WATCHDOG_USEC", "0"))
        except ValueError:
            usec = 0
        if usec > 0 and (not pid or pid == str(os.getpid())) and env.get("NOTIFY_SOCKET"):
            self.interval = usec / 2e6
        self.next_ping = 0.0

    def due(self) -> float:
        """Monotonic time of the next ping (inf without a watchdog)."""
        return self.next_ping if self.interval else INF

    def tick(self, now: float) -> None:
        """Ping if due; call from every loop iteration."""
        if self.interval and now >= self.next_ping:
            notify("WATCHDOG=1", self._env)
            self.next_ping = now + self.interval
