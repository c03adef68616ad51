"""The in-hand slot: which message's handler runs, for exact crash blame.

A dispatcher that offers the slot starts the worker with ``PEPSI_INHAND_FD``
naming an open file descriptor of a small shared memory file (a memfd). The
worker maps its first 8 bytes and keeps a signed 64-bit integer there, in the
machine's byte order:

* ``0`` -- never written: the worker does not use the slot (the dispatcher
  then blames a crash on the head of line, as the plain protocol says);
* ``-1`` -- the worker uses the slot, and no handler runs right now;
* an id -- the handler of that message runs.

A slot of 16 bytes or more has a second integer: what else the worker can
do, as bits (:data:`CAN_TEMPLATE`: serve as a template process that forks
the stage's next workers, see ``template.py``; :data:`CAN_TAKE_ROWS`: read a
claimed row on its input line instead of loading it, see ``loading.py``).
The SDK sets :data:`CAN_TAKE_ROWS` only when it will not pin its rows
(``pinning.py``): the pin reads every row again, so a row on the line would
cost the dispatcher its rendering for nothing.

A store of an aligned 8-byte integer is one instruction, so whatever kills the
worker (a signal, the OOM killer, ``os._exit``), the dispatcher reads after its
death either the old value or the new one, never a mix. Writing it costs no
system call.
"""

from __future__ import annotations

import mmap
import os
import struct

from pepsi_dispatch.contract import (
    CAN_TAKE_ROWS,
    CAN_TEMPLATE,
    INHAND_ENV,
    INHAND_WORD,
    NONE_IN_HAND,
)

__all__ = ["InHand", "announce_template", "from_environment"]

_FORMAT = INHAND_WORD
SIZE = struct.calcsize(_FORMAT)


class InHand:
    """The worker's side of the slot (a no-op when the dispatcher offers none)."""

    def __init__(self, slot: mmap.mmap | None) -> None:
        self._slot = slot
        self.clear()

    @property
    def offered(self) -> bool:
        """Does the dispatcher read this slot (exact blame)?"""
        return self._slot is not None

    def hold(self, message_id: int | None) -> None:
        """The handler of ``message_id`` is about to run (None: a line that is
        no id, for which no handler runs)."""
        if self._slot is not None:
            value = NONE_IN_HAND if message_id is None else message_id
            struct.pack_into(_FORMAT, self._slot, 0, value)

    def clear(self) -> None:
        """No handler runs (between messages, loading, committing, answering)."""
        if self._slot is not None:
            struct.pack_into(_FORMAT, self._slot, 0, NONE_IN_HAND)

    def take_rows(self) -> None:
        """Say that this worker reads claimed rows on its input lines
        (:data:`CAN_TAKE_ROWS`); a no-op without a slot of two words."""
        if self._slot is not None and len(self._slot) >= 2 * SIZE:
            (bits,) = struct.unpack_from(_FORMAT, self._slot, SIZE)
            struct.pack_into(_FORMAT, self._slot, SIZE, bits | CAN_TAKE_ROWS)


def from_environment() -> InHand:
    """The slot the dispatcher offers through ``PEPSI_INHAND_FD``, mapped; the
    variable is removed and the descriptor closed, so that programs the handlers
    start neither see nor inherit it. Anything unusable means: no slot."""
    text = os.environ.pop(INHAND_ENV, "")
    if not text:
        return InHand(None)
    try:
        fd = int(text)
    except ValueError:
        return InHand(None)
    try:
        size = os.fstat(fd).st_size
        slot = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError):
        return InHand(None)
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    if size < SIZE:
        return InHand(None)
    if size >= 2 * SIZE:
        # Rows on the lines: said once the worker knows it will not pin (take_rows).
        struct.pack_into(_FORMAT, slot, SIZE, CAN_TEMPLATE)
    return InHand(slot)


def announce_template() -> bool:
    """Say in the capability word of the offered slot that this program can be
    its stage's template; the slot is left as it is otherwise (``PEPSI_INHAND_FD``
    stays, so :func:`from_environment` can still map it later). False when no
    slot of two words is offered."""
    try:
        fd = int(os.environ.get(INHAND_ENV, ""))
        if os.fstat(fd).st_size < 2 * SIZE:
            return False
        with mmap.mmap(fd, 2 * SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as slot:
            (bits,) = struct.unpack_from(_FORMAT, slot, SIZE)
            struct.pack_into(_FORMAT, slot, SIZE, bits | CAN_TEMPLATE)
    except (OSError, ValueError):
        return False
    return True
