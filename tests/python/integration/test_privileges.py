"""Dropping root to SERVICE_USER (uid, gid, supplementary groups), in child processes."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pepsi_dispatch.coordinator.privileges import drop_privileges
from pepsi_dispatch.errors import UsageError

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop privileges")

REPORT = textwrap.dedent(
    """
    import json, os, sys
    from pepsi_dispatch.coordinator.privileges import drop_privileges
    {before}
    drop_privileges(sys.argv[1])
    try:
        os.setuid(0)
        regained = True
    except PermissionError:
        regained = False
    print(json.dumps({{
        "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "egid": os.getegid(),
        "saved": os.getresuid(), "groups": sorted(os.getgroups()), "regained": regained,
        "HOME": os.environ.get("HOME"), "USER": os.environ.get("USER"),
        "LOGNAME": os.environ.get("LOGNAME"),
    }}))
    """
)


def report(user: str, before: str = "") -> dict[str, object]:
    """Run a child that drops to `user` and reports who it is afterwards."""
    r = subprocess.run(
        [sys.executable, "-c", REPORT.format(before=before), user],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@needs_root
@pytest.mark.parametrize("user", ["nobody", "postgres"])
def test_drop_to_service_user(user: str) -> None:
    if not user_exists(user):
        pytest.skip(f"no user {user}")
    pw = pwd.getpwnam(user)
    got = report(user)
    assert got["uid"] == got["euid"] == pw.pw_uid
    assert got["saved"] == [pw.pw_uid] * 3
    assert got["gid"] == got["egid"] == pw.pw_gid
    assert got["groups"] == sorted(set(os.getgrouplist(user, pw.pw_gid)))
    assert 0 not in got["groups"]  # root's own groups are gone
    assert got["regained"] is False
    assert (got["HOME"], got["USER"], got["LOGNAME"]) == (pw.pw_dir, user, user)


def test_not_root_is_a_no_op() -> None:
    if os.geteuid() == 0:
        # become nobody first, then ask for another account: nothing may change
        got = report("postgres", before="os.setgroups([]); os.setgid(65534); os.setuid(65534)")
        assert got["uid"] == got["euid"] == 65534
    else:
        drop_privileges("no-such-user-pepsi")  # not root: not even looked up
        assert os.geteuid() != 0


@needs_root
def test_unknown_user_is_usage_error() -> None:
    with pytest.raises(UsageError) as info:
        drop_privileges("no-such-user-pepsi")
    assert str(info.value) == (
        "unknown SERVICE_USER 'no-such-user-pepsi' in [pepsi-dispatch]; "
        "create the account or set SERVICE_USER"
    )
    assert os.geteuid() == 0


@needs_root
def test_unknown_user_through_the_cli(tmp_path: Path) -> None:
    conf = tmp_path / "pepsi.conf"
    conf.write_text("[pepsi-dispatch]\nSERVICE_USER = no-such-user-pepsi\n")
    script = Path(sys.executable).with_name("pepsi-dispatch")
    r = subprocess.run(
        [str(script), "-c", str(conf), "serve"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [
        "pepsi-dispatch: error: unknown SERVICE_USER 'no-such-user-pepsi' in [pepsi-dispatch]; "
        "create the account or set SERVICE_USER"
    ]


@needs_root
def test_cli_drops_before_the_loop_starts(tmp_path: Path) -> None:
    """The loop (faked here) already runs as SERVICE_USER, with its groups."""
    conf = tmp_path / "pepsi.conf"
    conf.write_text("[pepsi-dispatch]\nSERVICE_USER = nobody\n")
    code = textwrap.dedent(
        """
        import json, os, sys, types
        loop = types.ModuleType("pepsi_dispatch.coordinator.dispatcher")
        def serve(config):
            print(json.dumps([os.getuid(), os.geteuid(), os.getgid(), sorted(os.getgroups())]))
            return 0
        loop.serve = serve
        sys.modules["pepsi_dispatch.coordinator.dispatcher"] = loop
        from pepsi_dispatch.cli.dispatch import main
        sys.exit(main(["-c", sys.argv[1], "-L", "ERROR", "serve"]))
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(conf)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    pw = pwd.getpwnam("nobody")
    uid, euid, gid, groups = json.loads(r.stdout)
    assert (uid, euid, gid) == (pw.pw_uid, pw.pw_uid, pw.pw_gid)
    assert groups == sorted(set(os.getgrouplist("nobody", pw.pw_gid)))
