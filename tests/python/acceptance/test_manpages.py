"""The man pages are generated from --help and docs/CONFIG.md, and the committed ones
(installed by the wheel) are current."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from pepsi_dispatch.devtools import manpages

BIN = Path(sys.executable).parent


def test_committed_pages_are_current() -> None:
    pages = manpages.generate(ROOT / "docs" / "CONFIG.md")
    for name in manpages.PAGES:
        committed = (ROOT / "man" / name).read_text(encoding="utf-8")
        assert committed == pages[name], f"man/{name} is stale: run 'make man'"


def _plain(page: str) -> str:
    return re.sub(r"\\f[BIR]", "", page).replace("\\-", "-").replace("\\e", "\\")


@pytest.mark.parametrize(
    ("prog", "sub"),
    [
        ("pepsi-dispatch", []),
        ("pepsi-dispatch", ["serve"]),
        ("pepsi-queue", []),
        ("pepsi-queue", ["migrate"]),
        ("pepsi-queue", ["enqueue"]),
        ("pepsi-queue", ["list"]),
        ("pepsi-queue", ["failed"]),
        ("pepsi-httpd", []),
    ],
)
def test_every_help_option_is_in_the_page(prog: str, sub: list[str]) -> None:
    out = subprocess.run(
        [str(BIN / prog), *sub, "--help"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    page = _plain((ROOT / "man" / f"{prog}.1").read_text())
    options = re.findall(r"^  (-[^ ].*?)(?:  |$)", out, re.M)
    assert options, out
    for opt in options:
        assert opt.strip() in page, (opt, prog, sub)


def test_config_page_follows_the_option_table() -> None:
    page = _plain((ROOT / "man" / "pepsi.conf.5").read_text())
    for option in ("WORKER_DSN", "LOG_FORMAT", "MAX_RUNTIME", "PROGRAM", "DSN"):
        assert option in page
    markdown = (ROOT / "docs" / "CONFIG.md").read_text()
    with pytest.raises(ValueError, match="LOG_FORMAT"):
        manpages.config_page(markdown.replace("| `LOG_FORMAT` |", "| `LOG_FORMATS` |"))


@pytest.mark.parametrize("name", manpages.PAGES)
def test_every_page_is_complete_and_links_the_others(name: str) -> None:
    page = (ROOT / "man" / name).read_text(encoding="utf-8")
    sections = re.findall(r"^\.SH (.+)$", page, re.M)
    wanted = ["NAME", "DESCRIPTION", "ENVIRONMENT", "SEE ALSO"]
    if name.endswith(".1"):
        wanted += ["SYNOPSIS", "OPTIONS", "EXIT STATUS"]
    for section in wanted:
        assert section in sections, (name, section, sections)
    see_also = _plain(page.split(".SH SEE ALSO", 1)[1])
    for other in manpages.PAGES:
        base, number = other.rsplit(".", 1)
        if other != name:
            assert f"{base}({number})" in see_also, (name, other)


def test_queue_page_has_migrate_list_and_roles_and_conf_page_the_overlay() -> None:
    queue = _plain((ROOT / "man" / "pepsi-queue.1").read_text())
    for text in ("migrate", "--current", "list", "--where", "pepsi_operator", "1h30m"):
        assert text in queue, text
    conf = _plain((ROOT / "man" / "pepsi.conf.5").read_text())
    assert ".SH DATABASE OVERLAY" in conf and "pepsi.config" in conf
