"""pepsi-httpd answers only requests that name it, and cannot be starved by connections.

Real pepsi-httpd processes, real sockets: the Host/Origin check against DNS
rebinding (guard.py) and the connection cap and request deadline (limits.py).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest
from dispatch_harness import Harness, harness_fixture, wait_until  # noqa: F401
from httpd_harness import Httpd


@pytest.fixture
def httpds() -> Iterator[list[Httpd]]:
    started: list[Httpd] = []
    yield started
    for s in started:
        s.stop()


ACTION = {"Content-Type": "application/json", "X-Pepsi-Action": "1"}


def test_requests_naming_another_host_are_refused(h: Harness, httpds: list[Httpd]) -> None:
    """DNS rebinding: a page whose name now points at 127.0.0.1 sends its own name as
    Host. Every request, read or action, that names another host is refused."""
    [wid] = h.enqueue("nowhere", 1)
    srv = Httpd(
        None,
        h.dsn,
        h.tmp / "httpd.log",
        allow_actions=True,
        args=["--allowed-host", "dash.example"],
    )
    httpds.append(srv)
    p = srv.port
    other_port = p + 1 if p < 65535 else p - 1
    for host in ("evil.example", f"evil.example:{p}", f"localhost.evil.example:{p}",
                 f"127.0.0.1:{other_port}", "127.0.0.1:x", "a b"):  # fmt: skip
        for path in ("/", "/metrics", "/healthz", "/api/overview", f"/api/message/{wid}"):
            status, body = srv.request("GET", path, {"Host": host})
            assert status == 421 and "refused: Host" in body, (host, path, status, body)
    cancel = json.dumps({"ids": [wid]}).encode()
    status, body = srv.request(
        "POST", "/api/cancel", {"Host": f"evil.example:{p}", **ACTION}, cancel
    )
    assert status == 421 and "--allowed-host" in body, body
    assert h.row(wid)["status"] == "pending"
    status, body = srv.request("GET", "/healthz", {})
    assert status == 400 and "no Host header" in body, body

    # The names it answers to: localhost, the listen address, the allowed names.
    for host in (f"127.0.0.1:{p}", f"localhost:{p}", f"[::1]:{p}", "localhost",
                 f"dash.example:{p}", f"DASH.Example:{p}"):  # fmt: skip
        status, body = srv.request("GET", "/api/overview", {"Host": host})
        assert status == 200, (host, body)

    # An Origin must match the Host (or be an allowed name).
    mine = f"localhost:{p}"
    for origin in (f"http://evil.example:{p}", "null", f"http://localhost:{other_port}",
                   f"file://localhost:{p}"):  # fmt: skip
        status, body = srv.request("GET", f"/api/message/{wid}", {"Host": mine, "Origin": origin})
        assert status == 403 and "refused: Origin" in body, (origin, body)
        status, body = srv.request(
            "POST", "/api/cancel", {"Host": mine, "Origin": origin, **ACTION}, cancel
        )
        assert status == 403, (origin, body)
    assert h.row(wid)["status"] == "pending"
    status, _ = srv.request(
        "GET", f"/api/message/{wid}", {"Host": mine, "Origin": f"http://{mine}"}
    )
    assert status == 200
    status, body = srv.request(
        "POST",
        "/api/cancel",
        {"Host": mine, "Origin": f"http://dash.example:{p}", **ACTION},
        cancel,
    )
    assert (status, json.loads(body)) == (200, {"rows": 1})
    assert "refused: Host 'evil.example'" in srv.log()  # each refusal is logged


def _open(port: int, first: bytes, timeout: float = 0.5) -> socket.socket | None:
    s = socket.socket()
    s.settimeout(timeout)
    try:
        s.connect(("127.0.0.1", port))
        if first:
            s.sendall(first)
    except OSError:
        s.close()
        return None
    return s


HALF_GET = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # no blank line: never ends
HALF_POST = (
    b"POST /api/cancel HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b'X-Pepsi-Action: 1\r\nContent-Length: 100\r\n\r\n{"ids": '  # the body never arrives
)


def test_idle_and_half_sent_connections_cannot_starve_healthz(
    h: Harness, httpds: list[Httpd]
) -> None:
    """At an open-file limit of 256, 300 connections that never finish their request
    (idle, half-sent headers, a POST whose body never arrives) still leave /healthz and
    /metrics answering at once."""
    srv = Httpd(None, h.dsn, h.tmp / "httpd.log", nofile=256, allow_actions=True)
    httpds.append(srv)
    socks = []
    try:
        for i in range(300):
            s = _open(srv.port, (b"", HALF_GET, HALF_POST)[i % 3])
            if s is not None:
                socks.append(s)
        for path in ("/healthz", "/metrics", "/healthz"):
            t0 = time.monotonic()
            try:
                status, body = srv.request("GET", path, {"Host": f"127.0.0.1:{srv.port}"}, None, 10)
            except OSError as exc:
                raise AssertionError(f"{path} got no answer: {exc!r}\n{srv.log()}") from exc
            assert time.monotonic() - t0 < 5, path
            if path == "/healthz":
                assert status == 503 and body.startswith("no live dispatcher"), body
            else:
                assert status == 200 and "pepsi_database_up 1.0" in body, body[:300]
        assert srv.proc.poll() is None
    finally:
        for s in socks:
            s.close()


def test_a_request_that_never_completes_is_cut_off(h: Harness, httpds: list[Httpd]) -> None:
    """Idle, half-sent, trickled (a slow-loris) and body-less POST connections are closed
    once --request-timeout has passed since they opened; complete requests still work."""
    srv = Httpd(
        None, h.dsn, h.tmp / "httpd.log", allow_actions=True, args=["--request-timeout", "1"]
    )
    httpds.append(srv)
    kinds = {"idle": b"", "half headers": HALF_GET, "POST without its body": HALF_POST}
    socks = {k: _open(srv.port, first, timeout=10) for k, first in kinds.items()}
    trickle = _open(srv.port, b"G", timeout=10)
    assert trickle is not None and all(socks.values())
    t0 = time.monotonic()
    closed: dict[str, float] = {}
    for name, s in socks.items():
        assert s is not None
        s.settimeout(8)
        try:
            data = s.recv(4096)
        except TimeoutError:
            data = b"still open"
        assert data == b"", (name, data)
        closed[name] = time.monotonic() - t0
        s.close()
    # A byte every 0.2 s keeps every single read short, never the whole request.
    sent = b"ET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 200
    cut = None
    for i, byte in enumerate(sent):
        try:
            trickle.sendall(bytes([byte]))
        except OSError:
            cut = time.monotonic() - t0
            break
        time.sleep(0.2)
        if i > 40:  # 8 s: long past the deadline
            break
    if cut is None:  # the last sends may still be buffered: the peer's close shows on read
        trickle.settimeout(2)
        try:
            cut = time.monotonic() - t0 if trickle.recv(4096) == b"" else None
        except OSError:
            cut = time.monotonic() - t0
    trickle.close()
    assert cut is not None and cut < 6, f"a trickled request was not cut off ({cut})"
    assert max(closed.values()) < 6, closed
    status, _ = srv.request("GET", "/metrics", {"Host": f"localhost:{srv.port}"})
    assert status == 200
    [wid] = h.enqueue("nowhere", 1)
    status, body = srv.request(
        "POST",
        "/api/cancel",
        {"Host": f"localhost:{srv.port}", **ACTION},
        json.dumps({"ids": [wid]}).encode(),
    )
    assert status == 200, body
