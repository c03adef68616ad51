"""A TCP proxy on 127.0.0.1 that can black-hole traffic: the network partition of the soak.

While partitioned, nothing is forwarded in either direction and nothing is
closed: no RST, no FIN; bytes already read wait in the proxy, the rest in the
kernels' buffers, and new connections are accepted but not connected
upstream. That is what a dropped-packet partition looks like to TCP, whose
retransmissions deliver everything once it heals: when it does, forwarding
resumes where it stopped. Loopback only.
"""

from __future__ import annotations

import socket
import threading


class BlackHoleProxy:
    def __init__(self, upstream_port: int, listen_port: int = 0) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", listen_port))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.open = threading.Event()
        self.open.set()
        self.closed = False
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def partition(self) -> None:
        self.open.clear()

    def heal(self) -> None:
        self.open.set()

    def close(self) -> None:
        self.closed = True
        self.open.set()
        try:
            self.sock.close()
        except OSError:
            pass

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self.open.wait()
        try:
            server = socket.create_connection(self.upstream, timeout=10)
            server.settimeout(None)
        except OSError:
            client.close()
            return
        for a, b in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                self.open.wait()  # a partition holds the bytes (and the EOF) here
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self.open.wait()
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                try:
                    s.close()
                except OSError:
                    pass
