"""The dispatcher's side of a worker's in-hand slot (exact crash blame).

Every worker is offered a small shared memory file (a memfd) through
``PEPSI_INHAND_FD``. A worker that uses it (the Python SDK does) keeps there
the id of the message whose handler runs; the dispatcher reads it only when
the worker has died, to blame that message alone instead of the head of
line. A worker that never writes it is treated exactly as before. The
layout is the contract's (``INHAND_*`` in pepsi_dispatch/contract.py).
"""

from __future__ import annotations

import mmap
import os
import struct

from pepsi_dispatch.contract import (
    CAN_TAKE_ROWS,
    CAN_TEMPLATE,
    INHAND_SIZE,
    INHAND_WORD,
    NONE_IN_HAND,
)

__all__ = ["InHandSlot"]

_WORD = struct.Struct(INHAND_WORD)


class InHandSlot:
    """One worker's slot: :attr:`fd` is passed to the child, then :meth:`handed_over`."""

    def __init__(self) -> None:
        fd = os.memfd_create("pepsi-inhand", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, INHAND_SIZE)
            self._map: mmap.mmap | None = mmap.mmap(fd, INHAND_SIZE)
        except OSError:
            os.close(fd)
            raise
        #: the descriptor the child inherits (None once handed over)
        self.fd: int | None = fd

    def handed_over(self) -> None:
        """The child has its copy: close ours (the mapping stays)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _word(self, index: int) -> int:
        if self._map is None:
            return 0
        return _WORD.unpack_from(self._map, index * _WORD.size)[0]

    @property
    def used(self) -> bool:
        """Has the worker written the slot (it names the message in hand)?"""
        return self._word(0) != 0

    def in_hand(self) -> int | None:
        """The id of the message whose handler runs, or None (not used, or no
        handler running)."""
        value = self._word(0)
        return None if value in (0, NONE_IN_HAND) else value

    @property
    def can_template(self) -> bool:
        """Did the worker say its program can be started as a template?"""
        return bool(self._word(1) & CAN_TEMPLATE)

    @property
    def takes_rows(self) -> bool:
        """Did the worker say it takes claimed rows on its pipe (CAN_TAKE_ROWS)?"""
        return bool(self._word(1) & CAN_TAKE_ROWS)

    def close(self) -> None:
        """Unmap the slot and close the descriptor if still ours."""
        self.handed_over()
        if self._map is not None:
            self._map.close()
            self._map = None
