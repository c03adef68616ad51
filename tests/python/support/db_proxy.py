"""A Unix-socket proxy in front of a PostgreSQL server, for cutting one client off.

``SocketProxy(server_dir, proxy_dir)`` listens on ``proxy_dir/.s.PGSQL.PORT``
and forwards every connection to the same socket name in ``server_dir``. A
client given ``host=proxy_dir`` reaches the server through it; :meth:`cut`
closes every forwarded connection and stops accepting (new connections are
refused), :meth:`restore` accepts again. Other clients are untouched.
"""

from __future__ import annotations

import os
import selectors
import socket
import threading
from pathlib import Path

__all__ = ["SocketProxy"]


class SocketProxy:
    """Forwards a Unix socket; cut and restored at will."""

    def __init__(self, server_dir: Path, proxy_dir: Path, port: int = 5432) -> None:
        self.target = str(server_dir / f".s.PGSQL.{port}")
        self.path = str(proxy_dir / f".s.PGSQL.{port}")
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        """Listen (again): new connections are forwarded."""
        if os.path.exists(self.path):
            os.unlink(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        os.chmod(self.path, 0o777)
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Close every forwarded connection and stop listening (connects are refused)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by cut()
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                server.connect(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, server]
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        try:
            while True:
                for key, _ in sel.select():
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    key.data.sendall(data)
        except (OSError, ValueError):
            return
        finally:
            sel.close()
            a.close()
            b.close()
