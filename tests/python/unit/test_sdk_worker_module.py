"""Unit tests of the SDK (no database): the stable public import path, pepsi_dispatch.worker."""

from __future__ import annotations

import os


def test_worker_module_is_the_stable_public_path() -> None:
    from pepsi_dispatch import worker
    from pepsi_dispatch.sdk import entry, message, template

    assert worker.__all__ == [
        "Advance",
        "Fail",
        "Finish",
        "Handler",
        "Message",
        "Pause",
        "Transition",
        "fork_point",
        "run",
    ]
    assert worker.run is entry.run and worker.Message is message.Message
    assert worker.fork_point is template.fork_point
    assert (worker.EX_TEMPFAIL, worker.MAX_REASON) == (75, 2000)
    assert worker.RECONNECT_TIMEOUT > 0


def test_fork_point_in_a_worker_sets_only_the_capability_word(tmp_path, monkeypatch) -> None:
    """In a worker, fork_point() returns at once and sets the "can be a template"
    bit in the slot's second word; the first word stays untouched (0: the slot
    is not used for blame) and PEPSI_INHAND_FD stays for a later run()."""
    import struct

    from pepsi_dispatch.contract import CAN_TEMPLATE, INHAND_ENV, INHAND_WORD, TEMPLATE_ENV
    from pepsi_dispatch.sdk import template

    slot = tmp_path / "slot"
    slot.write_bytes(bytes(16))
    fd = os.open(slot, os.O_RDWR)
    try:
        monkeypatch.setenv(INHAND_ENV, str(fd))
        monkeypatch.delenv(TEMPLATE_ENV, raising=False)
        template.fork_point()
        first, caps = struct.unpack("=" + INHAND_WORD.lstrip("=@") * 2, slot.read_bytes())
        assert (first, caps) == (0, CAN_TEMPLATE)
        assert os.environ[INHAND_ENV] == str(fd)
    finally:
        os.close(fd)


def test_fork_point_without_a_slot_does_nothing(monkeypatch) -> None:
    from pepsi_dispatch.contract import INHAND_ENV, TEMPLATE_ENV
    from pepsi_dispatch.sdk import template

    monkeypatch.delenv(INHAND_ENV, raising=False)
    monkeypatch.delenv(TEMPLATE_ENV, raising=False)
    template.fork_point()  # returns; nothing to announce to
