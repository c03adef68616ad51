"""A worker's last words: the stderr lines that say why a stage program died.

A program that dies at start (a missing module, a bad argument) says why on
stderr, but rarely on its last line: Node.js ends a crash with a blank line and
its version banner (``Node.js v20.20.2``), 15 lines below ``Error: Cannot find
module 'pg'``; Python ends with the exception, after the frames; a shell with
``script: line 3: x: command not found``. :class:`LastWords` keeps, as the lines
arrive, the first line of the worker's life that looks like an error and its
last few lines; :meth:`LastWords.cause` makes them one line for a hold-off's
cause (the WARNING log line, ``pepsi-queue status``, the dashboard, ``/healthz``).
:func:`stderr_cause` is the same selection over a whole text, for tests.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable

__all__ = ["CAUSE_CHARS", "LINE_CHARS", "LastWords", "looks_like_error", "stderr_cause"]

#: Each kept line is cut to this many characters.
LINE_CHARS = 300
#: The whole cause is cut to this many characters (the error line comes first).
CAUSE_CHARS = 600
#: Last lines shown after the error line (trailing banners not counted).
TAIL_LINES = 3
#: Last lines kept, so that TAIL_LINES remain once trailing banners are dropped.
KEEP_LINES = 8

_ERROR = re.compile(
    r"""(?:Uncaught\s+)?(?:[A-Za-z_$][\w.$]*)?(?:Error|Exception)\b  # Error: / TypeError [ERR_X]:
      | (?i:error|fatal|panic|critical)\b                    # error: / fatal: / ERROR:root:
      | .*:\ (?:line\ )?\d+:\                                # sh/bash: script: line 3: ...
      | .*\b(?:command\ not\ found|No\ such\ file\ or\ directory|Permission\ denied)\b
    """,
    re.VERBOSE,
)
#: A runtime's version banner that ends its crash report (Node.js, Bun, Deno).
_BANNER = re.compile(r"(?:Node\.js|Bun|Deno)\s+v?\d+(?:\.\d+)*(?:\s.*)?")
_WORDY = re.compile(r"\w")


def looks_like_error(line: str) -> bool:
    """Whether a (stripped) stderr line reads as an error message, not a frame or a log line."""
    return _ERROR.match(line) is not None


class LastWords:
    """The stderr lines of one worker that may say why it died (bounded memory)."""

    __slots__ = ("_count", "_first_error", "_tail")

    def __init__(self) -> None:
        self._count = 0
        #: (line number, text) of the first line of its life that looks like an error.
        self._first_error: tuple[int, str] | None = None
        self._tail: deque[tuple[int, str]] = deque(maxlen=KEEP_LINES)

    def note(self, lines: Iterable[str]) -> None:
        """Take stderr lines as they arrive; blank and punctuation-only ones carry nothing."""
        for raw in lines:
            line = raw.strip()
            if not _WORDY.search(line):
                continue
            line = line[:LINE_CHARS]
            self._count += 1
            if self._first_error is None and looks_like_error(line):
                self._first_error = (self._count, line)
            self._tail.append((self._count, line))

    def cause(self) -> str:
        """One line: the first error-like line, then (after ``…`` when lines lie
        between) the last few lines, a trailing version banner left out; ``""``
        when it wrote nothing."""
        tail = list(self._tail)
        while tail and _BANNER.fullmatch(tail[-1][1]):
            tail.pop()
        tail = tail[-TAIL_LINES:]
        error = self._first_error
        if error is None or (tail and error[0] >= tail[0][0]):
            # No error line, or it is among the last lines: from it (or them) on.
            start = error[0] if error is not None else 0
            text = " | ".join(line for n, line in tail if n >= start)
        else:
            gap = " … " if tail and tail[0][0] > error[0] + 1 else " | "
            after = [line for n, line in tail if n > error[0]]
            text = error[1] + (gap + " | ".join(after) if after else "")
        return text if len(text) <= CAUSE_CHARS else text[: CAUSE_CHARS - 1] + "…"


def stderr_cause(text: str) -> str:
    """:meth:`LastWords.cause` of a whole stderr text."""
    words = LastWords()
    words.note(text.splitlines())
    return words.cause()
