"""Connection limits of pepsi-httpd: a cap on open connections and a request deadline.

The threading server of the standard library gives every connection a thread
and waits on it for ever. Connections that never send a request, or send
half of one (a slow-loris, a POST whose body never arrives), then pile up
until the process reaches its open-file limit; after that ``accept()`` fails
and nothing is answered any more, ``/healthz`` included.

:class:`BoundedHTTPServer` keeps both bounded:

* **request deadline**: from its accept, a connection has ``request_timeout``
  seconds to deliver its request line, headers and body; a watchdog thread
  shuts down the socket of one that has not (its thread then ends at once).
  Sends and receives also time out after that long (a client that stops
  reading its answer).
* **cap**: at most ``max_connections`` connections are open, never more than
  the file limit allows (the soft ``RLIMIT_NOFILE`` minus a reserve for the
  database connection, logs and the interpreter). A new connection at the cap
  takes the place of the connection that has waited longest for its request;
  if every connection is busy answering, the new one gets ``503`` at once.
  Should ``accept()`` still fail for want of file descriptors, the
  longest-waiting connection is closed as well, so the listener recovers.

Answers are cheap (a cached snapshot), so a request that has arrived is
answered within the deadline; only connections still *waiting for* their
request are ever closed.
"""

from __future__ import annotations

import errno
import logging
import resource
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

log = logging.getLogger("pepsi_dispatch.httpd")

#: File descriptors kept free for everything but client connections.
FD_RESERVE = 32
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_REQUEST_TIMEOUT = 10.0
#: How often the watchdog looks (a fraction of the smallest useful deadline).
WATCH_INTERVAL = 0.2
BUSY_ANSWER = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\nContent-Length: 56\r\n\r\n"
    b"too many connections: every one is busy, try again soon\n"
)


def connection_cap(max_connections: int) -> int:
    """``max_connections``, lowered to fit the soft open-file limit (at least 1)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, soft - FD_RESERVE))


@dataclass
class _Conn:
    since: float  # monotonic time of the accept
    waiting: bool = True  # still waiting for its request (line, headers, body)
    closed: bool = field(default=False)  # shut down by us; its thread is ending


class BoundedHTTPServer(ThreadingHTTPServer):
    """A :class:`ThreadingHTTPServer` with a connection cap and a request deadline."""

    daemon_threads = True
    request_queue_size = 128  # the kernel's backlog: connections wait there, not in our fds

    def __init__(
        self,
        address: tuple[str, int],
        handler: Any,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    ) -> None:
        super().__init__(address, handler)
        self.max_connections = connection_cap(max_connections)
        self.request_timeout = request_timeout
        self._conns: dict[socket.socket, _Conn] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last_emfile_log = 0.0
        self._watchdog = threading.Thread(
            target=self._watch, name="pepsi-httpd-watchdog", daemon=True
        )
        self._watchdog.start()

    # -- bookkeeping ----------------------------------------------------------------
    def open_connections(self) -> int:
        """Connections accepted and not yet closed (for tests and logs)."""
        with self._lock:
            return sum(1 for c in self._conns.values() if not c.closed)

    def request_arrived(self, sock: socket.socket) -> None:
        """The handler has read the whole request: the deadline no longer applies."""
        with self._lock:
            conn = self._conns.get(sock)
            if conn is not None:
                conn.waiting = False

    def _close(self, sock: socket.socket, conn: _Conn, why: str) -> None:
        """Shut a connection down (its thread's read returns and the thread ends)."""
        conn.closed = True
        log.debug("closing a connection: %s", why)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _evict_longest_waiting(self, why: str) -> bool:
        """Close the connection that has waited longest for its request; False if none."""
        with self._lock:
            waiting = [
                (c.since, s, c) for s, c in self._conns.items() if c.waiting and not c.closed
            ]
            if not waiting:
                return False
            _since, sock, conn = min(waiting, key=lambda t: t[0])
            self._close(sock, conn, why)
            return True

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL):
            limit = time.monotonic() - self.request_timeout
            with self._lock:
                for sock, conn in list(self._conns.items()):
                    if conn.waiting and not conn.closed and conn.since < limit:
                        self._close(sock, conn, "no complete request within the deadline")

    # -- socketserver hooks ---------------------------------------------------------
    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                now = time.monotonic()
                if now - self._last_emfile_log > 10:
                    self._last_emfile_log = now
                    log.warning(
                        "cannot accept a connection: out of file descriptors (%s);"
                        " closing the connection that waited longest for its request",
                        exc.strerror,
                    )
                if not self._evict_longest_waiting("out of file descriptors"):
                    time.sleep(0.05)  # nothing to free: do not spin on the listener
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        sock: socket.socket = request
        sock.settimeout(self.request_timeout)
        with self._lock:
            live = sum(1 for c in self._conns.values() if not c.closed)
        if live >= self.max_connections and not self._evict_longest_waiting(
            f"at the cap of {self.max_connections} connections"
        ):
            try:
                sock.setblocking(False)
                sock.send(BUSY_ANSWER)
            except OSError:
                pass
            self.shutdown_request(sock)
            return
        with self._lock:
            self._conns[sock] = _Conn(since=time.monotonic())
        try:
            super().process_request(request, client_address)
        except BaseException:
            with self._lock:
                self._conns.pop(sock, None)
            raise

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self._conns.pop(request, None)
        super().shutdown_request(request)

    def server_close(self) -> None:
        self._stop.set()
        super().server_close()
