"""Unit tests of the SDK (no database): the stable public import path, pepsi_dispatch.worker."""

from __future__ import annotations


def test_worker_module_is_the_stable_public_path() -> None:
    from pepsi_dispatch import worker
    from pepsi_dispatch.sdk import entry, message

    assert worker.__all__ == [
        "Advance",
        "Fail",
        "Finish",
        "Handler",
        "Message",
        "Pause",
        "Transition",
        "run",
    ]
    assert worker.run is entry.run and worker.Message is message.Message
    assert (worker.EX_TEMPFAIL, worker.MAX_REASON) == (75, 2000)
    assert worker.RECONNECT_TIMEOUT > 0
