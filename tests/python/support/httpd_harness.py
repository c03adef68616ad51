"""Start a real `pepsi-httpd` process for tests and talk HTTP to it."""

from __future__ import annotations

import http.client
import json
import os
import re
import resource
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from dispatch_harness import VENV_BIN, wait_until

HTTPD = VENV_BIN / "pepsi-httpd"


class Httpd:
    """One pepsi-httpd on a free port (`--listen 127.0.0.1:0`); its log goes to `log_path`."""

    def __init__(
        self,
        conf: Path | None,
        dsn: str,
        log_path: Path,
        allow_actions: bool = False,
        args: list[str] | None = None,
        nofile: int | None = None,
    ) -> None:
        """``args``: more options; ``nofile``: the process's open-file limit (soft and hard)."""
        self.log_path = log_path
        cmd = [str(HTTPD), "--listen", "127.0.0.1:0", *(args or [])]
        if conf is not None:
            cmd += ["-c", str(conf)]
        if allow_actions:
            cmd.append("--allow-actions")
        self._log = open(log_path, "ab")  # noqa: SIM115

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PEPSI_DSN": dsn},
            preexec_fn=limit if nofile is not None else None,  # noqa: PLW1509 - no threads yet
        )

        def port() -> int | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"pepsi-httpd exited {self.proc.returncode}:\n{self.log()}")
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", self.log())
            return int(m.group(1)) if m else None

        self.port = wait_until(port, 30, 0.05, lambda: "pepsi-httpd to listen\n" + self.log())
        self.base = f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, str, str]:
        """(status, content type, body) of GET path."""
        try:
            with urllib.request.urlopen(self.base + path, timeout=30) as r:
                return r.status, r.headers.get("Content-Type", ""), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type", ""), e.read().decode()

    def post(
        self, path: str, payload: Any, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        hdrs = {"Content-Type": "application/json", "X-Pepsi-Action": "1", **(headers or {})}
        req = urllib.request.Request(
            self.base + path, data=json.dumps(payload).encode(), headers=hdrs, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes | None = None,
        timeout: float = 10,
    ) -> tuple[int, str]:
        """(status, body) of one request sent exactly with ``headers`` (Host included:
        nothing is added), over a fresh connection."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for k, v in headers.items():
                conn.putheader(k, v)
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            r = conn.getresponse()
            return r.status, r.read().decode()
        finally:
            conn.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
