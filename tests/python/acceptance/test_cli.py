"""The pepsi-dispatch command line and logging set-up (no database: the loop is faked)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from pepsi_dispatch import __version__
from pepsi_dispatch.cli import dispatch as cli
from pepsi_dispatch.cli import logsetup
from pepsi_dispatch.config import load as cfg
from pepsi_dispatch.errors import FatalError, UsageError

SCRIPT = Path(sys.executable).with_name("pepsi-dispatch")
LINE_RE = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d"  # local time, its UTC offset
    r" (DEBUG|INFO|WARNING|ERROR) pepsi-dispatch\[\d+\]: .*"
)


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No ambient configuration; root logger restored afterwards."""
    monkeypatch.delenv("PEPSI_CONFIG", raising=False)
    monkeypatch.delenv("PEPSI_DSN", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(cfg, "SYSTEM_CONFIG", tmp_path / "no-such-system.conf")
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
            h.close()
    root.setLevel(level)


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed console script."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("PEPSI_CONFIG", "PEPSI_DSN")}
    full_env.update(env or {})
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env=full_env
    )


def assert_one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("pepsi-dispatch: error: ")
    return lines[0]


@pytest.fixture
def fake_loop(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> types.SimpleNamespace:
    """Install a fake pepsi_dispatch.coordinator.dispatcher whose serve() records its call.

    $PEPSI_CONFIG names a one-stage file: with no file and no stage serve refuses.
    """
    conf = tmp_path / "found.conf"
    conf.write_text("[stage-a]\nPROGRAM = /bin/true\n")
    monkeypatch.setenv("PEPSI_CONFIG", str(conf))
    state = types.SimpleNamespace(config=None, result=0, raises=None, calls=[])
    module = types.ModuleType("pepsi_dispatch.coordinator.dispatcher")

    def serve(config: cfg.Config) -> int:
        state.calls.append("serve")
        state.config = config
        logging.getLogger("pepsi_dispatch.coordinator.dispatcher").info("fake loop serving")
        if state.raises is not None:
            raise state.raises
        return state.result

    module.serve = serve  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pepsi_dispatch.coordinator.dispatcher", module)
    # `import pepsi_dispatch.coordinator.dispatcher as m` reads the package's attribute, which an
    # earlier test's import of the real module has set: replace it too.
    import pepsi_dispatch.coordinator

    monkeypatch.setattr(pepsi_dispatch.coordinator, "dispatcher", module, raising=False)
    import pepsi_dispatch.coordinator.privileges as privileges

    monkeypatch.setattr(
        privileges, "drop_privileges", lambda user: state.calls.append(f"drop {user}")
    )
    return state


# --------------------------------------------------------------------------- real script


@pytest.mark.parametrize("flag", ["-v", "--version"])
def test_version(flag: str) -> None:
    r = run(flag)
    assert r.returncode == 0
    assert r.stdout == f"pepsi-dispatch {__version__}\n"


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help(flag: str) -> None:
    r = run(flag)
    assert r.returncode == 0
    for word in ("serve", "-c, --config FILE", "-L, --log-level LEVEL", "-l, --logfile", "-v"):
        assert word in r.stdout


def test_missing_serve() -> None:
    r = run()
    line = assert_one_error_line(r.stderr)
    assert r.returncode == 2
    assert "missing command" in line and "serve" in line


def test_missing_serve_with_options(tmp_path: Path) -> None:
    r = run("-L", "DEBUG")
    assert r.returncode == 2
    assert "missing command" in assert_one_error_line(r.stderr)


def test_bad_config_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.conf"
    r = run("-c", str(missing), "serve")
    assert r.returncode == 2
    line = assert_one_error_line(r.stderr)
    assert line == (
        f"pepsi-dispatch: error: {missing}: configuration file does not exist (given by -c); "
        "check the path"
    )


def test_bad_pepsi_config_env(tmp_path: Path) -> None:
    r = run("serve", env={"PEPSI_CONFIG": str(tmp_path / "nope.conf")})
    assert r.returncode == 2
    assert "$PEPSI_CONFIG" in assert_one_error_line(r.stderr)


def test_bad_graph(tmp_path: Path) -> None:
    path = tmp_path / "pepsi.conf"
    path.write_text("[stage-a]\nPROGRAM = /bin/true\nNEXT = bee\n[stage-b]\nPROGRAM = x\n")
    r = run("-c", str(path), "serve")
    assert r.returncode == 2
    line = assert_one_error_line(r.stderr)
    assert f"{path}:3: [stage-a] NEXT = 'bee': NEXT names undefined stage 'bee'" in line


@pytest.mark.parametrize("level", ["LOUD", ""])
def test_bad_level(level: str) -> None:
    r = run("-L", level, "serve")
    assert r.returncode == 2
    assert f"invalid log level '{level}' (-L)" in assert_one_error_line(r.stderr)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--frobnicate", "serve"], "No such option"),
        (["serv"], "No such command 'serv'"),
        (["serve", "extra"], "unexpected extra argument"),
        (["-c"], "requires an argument"),
    ],
)
def test_click_usage_errors_are_one_line(args: list[str], fragment: str) -> None:
    r = run(*args)
    assert r.returncode == 2
    assert fragment in assert_one_error_line(r.stderr)


# --------------------------------------------------------------------------- in process


def test_serve_order_and_result(
    fake_loop: types.SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "pepsi.conf"
    path.write_text("[pepsi-dispatch]\nSERVICE_USER = svc\n[stage-a]\nPROGRAM = /bin/true\n")
    fake_loop.result = 0
    assert cli.main(["-c", str(path), "-L", "warning", "serve"]) == 0
    assert fake_loop.calls == ["drop svc", "serve"]
    assert fake_loop.config.path == path
    assert list(fake_loop.config.stages) == ["a"]
    assert logging.getLogger().level == logging.WARNING


def test_serve_returns_loop_exit_code(fake_loop: types.SimpleNamespace) -> None:
    fake_loop.result = 3
    assert cli.main(["serve"]) == 3


def test_loop_usage_error_exits_2(
    fake_loop: types.SimpleNamespace, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_loop.raises = UsageError("database postgresql:///pepsi is served by dispatcher 7")
    assert cli.main(["-L", "ERROR", "serve"]) == 2
    line = assert_one_error_line(capsys.readouterr().err)
    assert line.endswith("is served by dispatcher 7")


def test_loop_fatal_error_exits_1(
    fake_loop: types.SimpleNamespace, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_loop.raises = FatalError("reloaded graph does not parse: ...")
    assert cli.main(["-L", "ERROR", "serve"]) == 1
    assert "reloaded graph" in assert_one_error_line(capsys.readouterr().err)


def test_unexpected_exception_is_one_line_exit_1(
    fake_loop: types.SimpleNamespace, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_loop.raises = RuntimeError("boom\nsecond line")
    assert cli.main(["-L", "ERROR", "serve"]) == 1
    line = assert_one_error_line(capsys.readouterr().err)
    assert "internal error: RuntimeError: boom second line" in line


def test_keyboard_interrupt_exits_130(fake_loop: types.SimpleNamespace) -> None:
    fake_loop.raises = KeyboardInterrupt()
    assert cli.main(["serve"]) == 130


def test_logfile(fake_loop: types.SimpleNamespace, tmp_path: Path) -> None:
    logfile = tmp_path / "dispatch.log"
    fake_loop.raises = FatalError("it broke")
    assert cli.main(["-l", str(logfile), "-L", "DEBUG", "serve"]) == 1
    lines = logfile.read_text().splitlines()
    assert any(line.endswith(": fake loop serving") for line in lines)
    assert lines[-1].endswith(": it broke")  # the fatal error is in the log file too
    for line in lines:
        assert LINE_RE.fullmatch(line), line
    assert f"pepsi-dispatch[{os.getpid()}]" in lines[0]


def test_unwritable_logfile_is_usage_error(
    fake_loop: types.SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["-l", str(tmp_path / "no" / "such" / "dir.log"), "serve"]) == 2
    assert "cannot open log file" in assert_one_error_line(capsys.readouterr().err)
    assert fake_loop.calls == []


# --------------------------------------------------------------------------- logsetup


@pytest.mark.parametrize(
    ("name", "level"),
    [
        ("DEBUG", logging.DEBUG),
        ("debug", logging.DEBUG),
        ("BULK", logging.DEBUG),
        ("INFO", logging.INFO),
        ("MESSAGE", logging.INFO),
        ("WARNING", logging.WARNING),
        ("warn", logging.WARNING),
        ("ERROR", logging.ERROR),
    ],
)
def test_parse_level(name: str, level: int) -> None:
    assert logsetup.parse_level(name) == level


def test_parse_level_rejects() -> None:
    with pytest.raises(UsageError, match="invalid log level 'chatty'"):
        logsetup.parse_level("chatty")


def test_setup_logging_format_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    logsetup.setup_logging("INFO", None)
    log = logging.getLogger("pepsi_dispatch.test")
    log.debug("hidden")
    log.info("worker %d started for stage %s", 42, "resize")
    log.warning("multi\nline")
    err = capsys.readouterr().err.splitlines()
    assert "hidden" not in "\n".join(err)
    assert LINE_RE.fullmatch(err[0])
    assert err[0].endswith(
        f" INFO pepsi-dispatch[{os.getpid()}]: worker 42 started for stage resize"
    )
    assert err[1].endswith(f"WARNING pepsi-dispatch[{os.getpid()}]: multi")
    assert err[2] == "    line"


def test_setup_logging_replaces_its_own_handler(tmp_path: Path) -> None:
    first = logsetup.setup_logging("INFO", str(tmp_path / "a.log"))
    second = logsetup.setup_logging("INFO", str(tmp_path / "b.log"))
    root = logging.getLogger().handlers
    assert second in root and first not in root
    logging.getLogger("x").error("only in b")
    assert (tmp_path / "a.log").read_text() == ""
    assert "only in b" in (tmp_path / "b.log").read_text()
