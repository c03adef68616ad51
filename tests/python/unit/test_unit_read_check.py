"""serve --check, as root, sees a configuration file the shipped unit could not read.

The unit keeps only CAP_SETUID and CAP_SETGID (its CapabilityBoundingSet), so
root reads its configuration by the mode bits alone; a root shell, with
CAP_DAC_OVERRIDE, reads anything. Runs as root (the case it is about);
``setpriv`` stands in for systemd to show the check agrees with the kernel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pepsi_dispatch.coordinator.checks import readable_without_dac_override, unit_read_checks

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="about root's reads; runs as root")

NOBODY = 65534


def config(tmp_path: Path, uid: int, mode: int) -> Path:
    os.chmod(tmp_path, 0o755)
    path = tmp_path / "pepsi.conf"
    path.write_text("[pepsi-dispatch]\nSERVICE_USER = nobody\n")
    os.chown(path, uid, 0)
    path.chmod(mode)
    return path


def unit_can_read(path: Path) -> bool:
    """What root under the unit's capability bounding set gets (setpriv for systemd)."""
    out = subprocess.run(
        ["setpriv", "--bounding-set", "-all,+setuid,+setgid", "cat", str(path)],
        capture_output=True,
        check=False,
    )
    return out.returncode == 0


def test_a_service_users_0600_file_fails_the_check_and_the_unit(tmp_path: Path) -> None:
    path = config(tmp_path, NOBODY, 0o600)
    assert path.read_text()  # a root shell reads it
    assert not readable_without_dac_override(str(path))
    [check] = unit_read_checks([str(path)], "nobody")
    assert not check.ok and "CAP_DAC_OVERRIDE" in check.detail
    assert f"chmod 0640 {path}" in check.detail
    if shutil.which("setpriv"):
        assert not unit_can_read(path), "the kernel agrees: the unit could not read it"


def test_a_root_owned_0640_file_passes_the_check_and_the_unit(tmp_path: Path) -> None:
    path = config(tmp_path, 0, 0o640)
    assert readable_without_dac_override(str(path))
    assert unit_read_checks([str(path)], "nobody") == []
    if shutil.which("setpriv"):
        assert unit_can_read(path)


def test_a_directory_root_cannot_search_fails_too(tmp_path: Path) -> None:
    inner = tmp_path / "etc"
    inner.mkdir()
    path = config(inner, 0, 0o644)
    os.chown(inner, NOBODY, 0)
    inner.chmod(0o700)
    assert not readable_without_dac_override(str(path))
