"""The worker side of the pipe protocol as the dispatcher sees it (docs/WORKERS.md).

The dispatcher writes decimal workqueue ids, one per line, to a worker's stdin
and reads one answer line per id from its stdout, in order:

* ``0`` -- success; ``0 fused=b,c`` -- success, and the worker also ran the
  successor stages ``b`` and ``c`` in the same pass;
* ``N reason text`` with ``N`` a non-zero integer -- that message failed;
* anything else -- a protocol error (the message fails, the worker is stopped).

This module only classifies lines; what to do with them is the loop's job.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Final

from pepsi_dispatch.contract import MAX_LINE, MAX_NUMBER_DIGITS, STAGE_NAME_RE


class AnswerKind(enum.Enum):
    """What an answer line says about its message."""

    #: ``0`` or ``0 fused=b,c``: done; the stage wrote the row's next state.
    OK = "ok"
    #: ``N reason`` (N non-zero): the message failed; the worker lives on.
    FAILED = "failed"
    #: anything else: the message fails and the worker is stopped.
    PROTOCOL_ERROR = "protocol_error"


_INT = re.compile(r"[+-]?[0-9]+\Z")


@dataclass(frozen=True, slots=True)
class Answer:
    """One classified answer line.

    ``kind`` is what the line says (:class:`AnswerKind`);
    ``fused`` lists the stages a successful pass also ran; ``text`` is the
    line as received (decoded, without its newline), used as the reason.
    """

    kind: AnswerKind
    text: str
    fused: tuple[str, ...] = ()


#: The one answer a busy pipeline sends thousands of times a second: shared,
#: so the hot path allocates nothing for it.
ANSWER_OK: Final = Answer(AnswerKind.OK, "0")


def parse_answer(line: bytes) -> Answer:
    """Classify one answer line (``line`` without its trailing newline).

    A trailing carriage return is tolerated (a worker written on Windows
    habits is still speaking the protocol).
    """
    if line == b"0":
        return ANSWER_OK
    if line.endswith(b"\r"):
        line = line[:-1]
        if line == b"0":
            return ANSWER_OK
    # NUL cannot go into a PostgreSQL text value: one such byte would make the
    # dispatch_error write fail for ever, so it is spelled out instead.
    text = line[:MAX_LINE].decode("utf-8", errors="replace").replace("\x00", "\\0")
    head, sep, rest = text.partition(" ")
    if not _INT.match(head):
        return Answer(AnswerKind.PROTOCOL_ERROR, text)
    if len(head) > MAX_NUMBER_DIGITS:
        return Answer(AnswerKind.PROTOCOL_ERROR, text)
    # Zero or not is read off the digits, never through int(): no answer line
    # may raise out of here.
    if head.lstrip("+-").strip("0"):
        # "N reason": the reason is optional in practice; the line is the reason.
        return Answer(AnswerKind.FAILED, text)
    # "0 ..." -- only "0 fused=a,b" is valid.
    rest = rest.strip()
    if not rest:
        return ANSWER_OK
    if not rest.startswith("fused="):
        return Answer(AnswerKind.PROTOCOL_ERROR, text)
    names = tuple(n for n in rest[len("fused=") :].split(","))
    if not names or not all(STAGE_NAME_RE.fullmatch(n) for n in names):
        return Answer(AnswerKind.PROTOCOL_ERROR, text)
    return Answer(AnswerKind.OK, text, names)
