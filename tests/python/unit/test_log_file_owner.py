"""A log file that ``-l`` created as root goes to the service user before the drop.

``pepsi-dispatch -l FILE serve`` started as root opens FILE before it drops to
SERVICE_USER; a file it created was root's, and the check that the service
user can reopen it (after a rotation) then refused to start (exit 2). A file
that existed keeps its owner. Runs as root only (chown); no processes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from pepsi_dispatch.cli.logsetup import setup_logging
from pepsi_dispatch.coordinator.privileges import hand_over_logs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")

NOBODY = 65534


def _remove_our_handlers() -> None:
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_pepsi", False):
            root.removeHandler(h)
            h.close()


def test_a_log_file_created_as_root_is_handed_to_the_service_user(tmp_path: Path) -> None:
    path = tmp_path / "dispatch.log"
    try:
        setup_logging("INFO", str(path))
        assert hand_over_logs(NOBODY, NOBODY) == [str(path)]
    finally:
        _remove_our_handlers()
    assert (path.stat().st_uid, path.stat().st_gid) == (NOBODY, NOBODY)


def test_a_log_file_that_existed_keeps_its_owner(tmp_path: Path) -> None:
    path = tmp_path / "dispatch.log"
    path.touch(0o640)
    try:
        setup_logging("INFO", str(path))
        assert hand_over_logs(NOBODY, NOBODY) == []
    finally:
        _remove_our_handlers()
    assert path.stat().st_uid == 0
