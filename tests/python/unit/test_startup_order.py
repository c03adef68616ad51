"""Start-up order (no database): LISTEN comes before anything a notification
could be about is read, and before the dispatcher tells the world it is up.

An overlay row written between the start-up read of ``pepsi.config`` and the
LISTEN used to be lost for good: no reload ever came. Tests (and operators)
that wait for the dispatcher's registration and then change the overlay hit
exactly that window, because registering came before the LISTEN.
"""

from __future__ import annotations

import logging

import pytest
from fake_store import FakeStore

from pepsi_dispatch.config import load_config
from pepsi_dispatch.contract import SCHEMA_FLOOR
from pepsi_dispatch.coordinator.startup import open_database
from pepsi_dispatch.errors import UsageError


def recording(lock: bool = True) -> FakeStore:
    """The fake store, its schema at the floor; ``calls`` records the order."""
    db = FakeStore(schema_version=SCHEMA_FLOOR)
    db.lock = lock
    return db


def test_listen_precedes_the_overlay_read_and_the_registration() -> None:
    db = recording()
    config, dispatcher_id = open_database(db, load_config())
    assert dispatcher_id == 7
    calls = db.calls
    assert calls.index("start_listening") < calls.index("overlay"), calls
    assert calls.index("start_listening") < calls.index("register"), calls
    # LISTEN only once the lock is ours: a refused dispatcher never listens.
    assert calls.index("try_lock") < calls.index("start_listening"), calls


def test_a_refused_dispatcher_never_listens() -> None:
    db = recording(lock=False)
    with pytest.raises(UsageError, match="another dispatcher already serves"):
        open_database(db, load_config())
    assert "start_listening" not in db.calls


def with_overlay(program: str) -> FakeStore:
    """A database whose overlay sets a stage's PROGRAM."""
    db = recording()
    db.overlay_rows = [("stage-b", "PROGRAM", program)]
    return db


def test_a_program_only_the_overlay_sets_is_checked_at_start(tmp_path, caplog) -> None:
    """It does not stop the start (the stage is held off, the others run), but
    the log names it and the row to fix."""
    db = with_overlay(str(tmp_path / "no-such-program"))
    with caplog.at_level(logging.WARNING, logger="pepsi_dispatch.coordinator.startup"):
        config, _ = open_database(db, load_config())
    assert "b" in config.stages and "register" in db.calls
    (record,) = [r for r in caplog.records if "no-such-program" in r.getMessage()]
    message = record.getMessage()
    assert record.levelno == logging.WARNING
    assert message.startswith("stage b: PROGRAM ") and "does not exist" in message, message
    assert "pepsi.config row [stage-b] PROGRAM" in message and "held off" in message, message


def test_a_runnable_overlay_program_starts(tmp_path) -> None:
    program = tmp_path / "stage-b"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    db = with_overlay(str(program))
    config, _ = open_database(db, load_config())
    assert config.stages["b"].program == str(program)


def test_a_schema_below_the_floor_is_refused_before_listening() -> None:
    db = recording()
    db.version = "0001"
    with pytest.raises(UsageError, match=f"needs {SCHEMA_FLOOR} or later"):
        open_database(db, load_config())
    assert "start_listening" not in db.calls and "register" not in db.calls
