"""The worker's side of the pipe protocol (docs/WORKERS.md): id lines in, answer lines out.

Answer lines are ``0``, ``0 fused=b,c`` or ``1 reason``; the reason is one line
of at most :data:`MAX_REASON` characters (:func:`one_line`).
"""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Callable

__all__ = [
    "MAX_REASON",
    "LineReader",
    "exc_reason",
    "one_line",
    "parse_id",
    "protect_stdio",
    "write_answers",
]

#: Longest reason put on an answer line (the dispatcher cuts lines at 8 KiB).
MAX_REASON = 2000


def one_line(text: str) -> str:
    """``text`` on one line, at most MAX_REASON characters, never empty."""
    text = " ".join(str(text).split())
    if len(text) > MAX_REASON:
        text = text[: MAX_REASON - 3] + "..."
    return text or "failed"


def exc_reason(exc: BaseException) -> str:
    """``Type: message`` (or ``Type``) of an exception, on one line."""
    message = str(exc)
    name = type(exc).__name__
    return one_line(f"{name}: {message}" if message else name)


def parse_id(line: bytes) -> int | None:
    """The message id on an input line (a bare id, or the first field of a row
    line: ``CAN_TAKE_ROWS`` in pepsi_dispatch/contract.py), or None for garbage."""
    try:
        return int(line.partition(b"\t")[0].strip())
    except ValueError:
        return None


class LineReader:
    """Reads id lines from a raw file descriptor, reporting what is already buffered.

    ``before_block`` is called before a read that may block and ``after_block``
    after it (also when it raised): a stop signal may interrupt that read.
    """

    def __init__(
        self, fd: int, before_block: Callable[[], None], after_block: Callable[[], None]
    ) -> None:
        self.fd = fd
        self.buf = b""
        self.eof = False
        self._before_block = before_block
        self._after_block = after_block

    def _fill(self, block: bool) -> None:
        if self.eof:
            return
        if block:
            self._before_block()
            try:
                chunk = os.read(self.fd, 65536)
            finally:
                self._after_block()
        else:
            ready, _, _ = select.select([self.fd], [], [], 0)
            if not ready:
                return
            chunk = os.read(self.fd, 65536)
        if chunk:
            self.buf += chunk
        else:
            self.eof = True

    def lines(self) -> list[bytes]:
        """Block until at least one line (or EOF), then return every complete line buffered.

        An empty list means EOF. A last line without newline at EOF counts as a line.
        """
        while True:
            while b"\n" not in self.buf and not self.eof:
                self._fill(block=True)
            self._fill(block=False)
            out: list[bytes] = []
            if b"\n" in self.buf:
                head, _, self.buf = self.buf.rpartition(b"\n")
                out = [line for line in head.split(b"\n") if line.strip()]
            elif self.eof:
                out = [self.buf] if self.buf.strip() else []
                self.buf = b""
            if out or (self.eof and not self.buf):
                return out

    def ready(self) -> list[bytes]:
        """The complete lines already waiting, never blocking ([] when none).

        A line without its newline yet stays buffered for :meth:`lines`.
        """
        self._fill(block=False)
        if b"\n" not in self.buf:
            return []
        head, _, self.buf = self.buf.rpartition(b"\n")
        return [line for line in head.split(b"\n") if line.strip()]


def write_answers(fd: int, answers: list[str]) -> None:
    """Write the answer lines (without newlines) to ``fd``, all of them."""
    data = "".join(line + "\n" for line in answers).encode()
    while data:
        n = os.write(fd, data)
        data = data[n:]


def protect_stdio() -> tuple[int, int]:
    """Move the protocol's pipes aside; return (answer fd, input fd).

    Afterwards fd 1 and ``sys.stdout`` point at stderr and fd 0 and ``sys.stdin``
    at /dev/null, so nothing a handler prints or reads touches the protocol.
    """
    answer_fd = os.dup(1)
    input_fd = os.dup(0)
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout = sys.stderr
    sys.stdin = open(os.devnull)  # noqa: SIM115
    return answer_fd, input_fd
