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
    text = re.sub(r"\\\[u([0-9A-F]{4,})\]", lambda m: chr(int(m.group(1), 16)), page)
    return re.sub(r"\\f[BIR]|\\&", "", text).replace("\\-", "-").replace("\\e", "\\")


def _help(prog: str, *sub: str) -> str:
    return subprocess.run(
        [str(BIN / prog), *sub, "--help"], capture_output=True, text=True, timeout=30, check=True
    ).stdout


def _help_options(text: str) -> list[str]:
    """The option column of a --help text's Options section (``-c, --config FILE``)."""
    block = text.split("\nOptions:\n", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^  (-[^ ].*?)(?:  |$)", block, re.M)


def _help_commands(text: str) -> list[str]:
    """The subcommands a group's --help lists."""
    if "\nCommands:\n" not in text:
        return []
    block = text.split("\nCommands:\n", 1)[1]
    return re.findall(r"^  ([a-z][a-z-]*)", block, re.M)


def _page_blocks(page: str) -> dict[str, str]:
    """``.SH``/``.SS`` heading (and a ``.SS``'s first word: a subcommand) -> its plain text."""
    blocks: dict[str, str] = {}
    for part in re.split(r"^(?=\.S[HS] )", page, flags=re.M):
        head, _, body = part.partition("\n")
        if head.startswith((".SH ", ".SS ")):
            key = _plain(head[4:]).strip()
            blocks[key] = _plain(body)
            if head.startswith(".SS"):  # a subcommand's usage: also by its name
                blocks.setdefault(key.split()[0], blocks[key])
    return blocks


def _missing_options(prog: str, page: str) -> list[str]:
    """What ``prog --help`` and each ``prog COMMAND --help`` show that ``page`` lacks
    where it belongs (OPTIONS, or the command's own ``.SS``)."""
    blocks = _page_blocks(page)
    top = _help(prog)
    missing = [f"{prog} {o}" for o in _help_options(top) if o.strip() not in blocks["OPTIONS"]]
    for name in _help_commands(top):
        where = blocks.get(name, "")
        missing += [f"{prog} {name} {o}" for o in _help_options(_help(prog, name))
                    if o.strip() not in where]  # fmt: skip
    return missing


@pytest.mark.parametrize("prog", ["pepsi-dispatch", "pepsi-queue", "pepsi-httpd"])
def test_every_option_any_help_shows_is_in_its_section_of_the_page(prog: str) -> None:
    page = (ROOT / "man" / f"{prog}.1").read_text(encoding="utf-8")
    assert prog == "pepsi-httpd" or _help_commands(_help(prog)), "subcommands not found"
    assert _missing_options(prog, page) == [], f"man/{prog}.1 lacks what --help shows"


def test_the_option_check_sees_an_option_a_page_lacks() -> None:
    page = (ROOT / "man" / "pepsi-dispatch.1").read_text(encoding="utf-8")
    assert _missing_options("pepsi-dispatch", page.replace("\\-\\-check", "")) == [
        "pepsi-dispatch serve --check"
    ]


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
    assert ".SH THE DATABASE OVERLAY" in conf and "pepsi.config" in conf


def _entries(page: str) -> dict[str, set[str]]:
    """``.SH``/``.SS`` heading (casefolded) -> the bold tags of its ``.TP`` entries."""
    out: dict[str, set[str]] = {}
    for part in re.split(r"^(?=\.S[HS] )", page, flags=re.M):
        head, _, body = part.partition("\n")
        tags = re.findall(r"^\.TP\n\\fB(.+?)\\fR", body, re.M)
        out[_plain(head[4:]).strip().casefold()] = {_plain(t) for t in tags}
    return out


def _config_md_missing(markdown: str, page: str) -> list[str]:
    """What of docs/CONFIG.md ``page`` lacks: a ``##``/``###`` heading, an option
    table row in its section, a `code` text verbatim (``[stage-*]``, never ``[stage-]``)."""
    blocks = {k.casefold(): " ".join(v.split()) for k, v in _page_blocks(page).items()}
    headings = [h.replace("`", "") for h in re.findall(r"^###? (.+)$", markdown, re.M)]
    missing = [f"section {h}" for h in headings if h.casefold() not in blocks]
    for section, rows in manpages._config_tables(markdown).items():
        tags = _entries(page).get(f"[{section}]".casefold(), set())
        missing += [f"[{section}] {r[0]}" for r in rows if r[0] not in tags]
    flat = " ".join(_plain(page).split())
    spans = {" ".join(c.split()) for c in re.findall(r"`([^`]+)`", _strip_fences(markdown))}
    return missing + sorted(f"`{c}`" for c in spans if c not in flat)


def test_pepsi_conf_page_has_every_section_option_and_code_of_config_md() -> None:
    markdown = (ROOT / "docs" / "CONFIG.md").read_text(encoding="utf-8")
    page = (ROOT / "man" / "pepsi.conf.5").read_text(encoding="utf-8")
    assert _config_md_missing(markdown, page) == []
    flat = " ".join(_plain(page).split())
    for name in ("[schedule-NAME]", "[pepsi-httpd]", "HELD_OFF_LIMIT", "@INLINE@", "[stage-*]"):
        assert name in flat, name


def test_the_config_check_sees_a_section_and_code_a_page_lacks() -> None:
    markdown = (ROOT / "docs" / "CONFIG.md").read_text(encoding="utf-8")
    page = (ROOT / "man" / "pepsi.conf.5").read_text(encoding="utf-8")
    mangled = page.replace(".SH [schedule\\-NAME]", ".SH SCHEDULES").replace(
        "[stage\\-*]", "[stage\\-]"
    )
    got = _config_md_missing(markdown, mangled)
    assert "section [schedule-NAME]" in got and "[schedule-NAME] CRON" in got
    assert "`[stage-*]`" in got


def _strip_fences(markdown: str) -> str:
    return re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)


def test_pepsi_httpd_page_names_every_route_and_why_healthz_is_503() -> None:
    page = _plain((ROOT / "man" / "pepsi-httpd.1").read_text(encoding="utf-8"))
    source = (ROOT / "pepsi_dispatch" / "httpd" / "server.py").read_text(encoding="utf-8")
    routes = set(re.findall(r'"(/(?:metrics|healthz|favicon\.ico|static/|api/[a-z]+))', source))
    assert len(routes) >= 8, routes
    assert sorted(r for r in routes if r not in page) == []
    blocks = _page_blocks((ROOT / "man" / "pepsi-httpd.1").read_text(encoding="utf-8"))
    health = " ".join(blocks["HEALTH CHECK"].split())
    for cause in ("503", "no live dispatcher", "no dispatcher session", "held off", "database"):
        assert cause in health, cause
    env = blocks["ENVIRONMENT"]
    assert "HELD_OFF_LIMIT" in env and "only its [database]" not in env
