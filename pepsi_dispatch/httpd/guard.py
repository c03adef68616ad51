"""Which requests pepsi-httpd answers at all: the ``Host`` and ``Origin`` check.

A page whose name was re-pointed at 127.0.0.1 (DNS rebinding) is same-origin
to the browser, so neither the action header nor the JSON body stops it from
reading payloads or pressing the buttons. What gives it away is the name it
was loaded under: the ``Host`` header carries the attacker's name. So every
request, read or action, must name this server: the listen address,
localhost (``localhost``, ``127.0.0.1``, ``::1``) or a name the operator
allowed with ``--allowed-host``, with this server's port when a port is
given. An ``Origin`` header, when present, must be ``http(s)://`` plus the
request's own ``Host``, or an allowed name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

#: Names that are always this machine.
LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
#: Listen addresses that name no host (every interface).
WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def split_authority(authority: str) -> tuple[str, int | None] | None:
    """``name[:port]`` or ``[v6][:port]`` → (lower-case name, port or None); None if malformed."""
    text = authority.strip().lower()
    if not text or any(c in text for c in " /@\\?#"):
        return None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return None
        name, rest = text[1:end], text[end + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else None
    elif text.count(":") > 1:  # a bare IPv6 literal, no port
        name, port_text = text, None
    else:
        name, _, port_text = text.partition(":")
        if not _:
            port_text = None
    if port_text is None:
        return name, None
    if not port_text.isdigit() or not 0 < int(port_text) <= 65535:
        return None
    return name, int(port_text)


@dataclass(frozen=True)
class HostGuard:
    """The names and port this server answers to."""

    port: int
    names: frozenset[str]
    allowed: frozenset[str]  # the --allowed-host names alone (also good as an Origin)

    @classmethod
    def build(cls, listen_host: str, port: int, allowed: Iterable[str] = ()) -> HostGuard:
        """Localhost, the listen host (unless a wildcard) and the ``--allowed-host`` names."""
        extra = frozenset(a.strip().strip("[]").lower() for a in allowed if a.strip())
        names = set(LOCAL_NAMES) | extra
        host = listen_host.strip("[]").lower()
        if host not in WILDCARDS:
            names.add(host)
        return cls(port=port, names=frozenset(names), allowed=extra)

    def _host_ok(self, authority: str) -> bool:
        parts = split_authority(authority)
        if parts is None:
            return False
        name, port = parts
        return name in self.names and (port is None or port == self.port)

    def refusal(self, host: str | None, origin: str | None) -> tuple[int, str] | None:
        """None to answer the request, else (status, reason) to refuse it."""
        if host is None or not host.strip():
            return 400, "refused: the request has no Host header"
        if not self._host_ok(host):
            allowed = ", ".join(sorted(self.names))
            return (
                421,
                f"refused: Host {host.strip()!r} is not this server (it answers to {allowed}"
                f" on port {self.port}; start pepsi-httpd with --allowed-host NAME to add one)",
            )
        if origin is not None and not self._origin_ok(origin, host):
            return 403, f"refused: Origin {origin.strip()!r} does not match Host {host.strip()!r}"
        return None

    def _origin_ok(self, origin: str, host: str) -> bool:
        url = urlsplit(origin.strip())
        if url.scheme not in ("http", "https") or not url.netloc or url.path not in ("", "/"):
            return False
        if url.netloc.lower() == host.strip().lower():
            return True
        parts = split_authority(url.netloc)
        return parts is not None and parts[0] in self.allowed
