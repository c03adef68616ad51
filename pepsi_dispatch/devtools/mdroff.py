"""The markdown of docs/*.md as man(7) roff, for the generated man pages.

Enough markdown for docs/CONFIG.md: ``##``/``###`` headings (``.SH``/``.SS``),
paragraphs, ``-`` and ``1.`` lists, fenced code (``.nf``), tables (an option
table, whose first header is ``option``, as ``.TP`` entries with their default;
any other as ``.TP`` entries of "header: cell" lines), and inline ``code``,
``**bold**`` and ``*italics*``. Code is taken verbatim: ``[stage-*]`` stays
``[stage-*]``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

__all__ = ["esc", "inline", "roff"]

_ITEM = re.compile(r"^\s*(?:([-*])|(\d+)\.)\s+(.*)$")


def esc(text: str) -> str:
    """Plain text to roff, within a line: backslashes, hyphens, and any character
    beyond ASCII as its ``\\[uXXXX]`` escape (groff without preconv, mandoc)."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return re.sub(r"[^\x00-\x7f]", lambda m: f"\\[u{ord(m.group()):04X}]", text)


def _line(text: str) -> str:
    """A roff text line: one starting with '.' or "'" would be a request."""
    return "\\&" + text if text[:1] in (".", "'") else text


def inline(text: str) -> str:
    """Inline markdown to roff fonts: `code` (verbatim, bold), **bold**, *italics*."""
    codes: list[str] = []

    def hold(m: re.Match[str]) -> str:
        codes.append(f"\\fB{esc(m.group(1))}\\fR")
        return f"\x00{len(codes) - 1}\x00"

    out = esc(re.sub(r"`([^`]+)`", hold, text))
    out = re.sub(r"\*\*(.+?)\*\*", r"\\fB\1\\fR", out)
    out = re.sub(r"(?<![\w*])\*(?=\S)(.+?)(?<=\S)\*(?![\w*])", r"\\fI\1\\fR", out)
    return re.sub("\x00(\\d+)\x00", lambda m: codes[int(m.group(1))], out)


def _heading(level: int, text: str) -> str:
    title = text.replace("`", "")
    if level == 2 and not title.startswith("["):
        title = title.upper()
    return (".SH " if level == 2 else ".SS ") + esc(title)


def _cells(row: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def _table(rows: list[str]) -> list[str]:
    header, body = _cells(rows[0]), [_cells(r) for r in rows[2:]]
    out = []
    for cells in body:
        if header[0].lower() == "option":
            default = f" (default: {inline(cells[1])})" if cells[1] else ""
            out += [".TP", f"\\fB{esc(cells[0].strip('`'))}\\fR{default}", _line(inline(cells[2]))]
            continue
        out += [".TP", _line(inline(cells[0]))]
        for i, (name, cell) in enumerate(zip(header[1:], cells[1:], strict=False)):
            out += [".br"] if i else []
            out.append(_line(f"{inline(name)}: {inline(cell)}"))
    return out


def _blocks(markdown: str) -> Iterator[tuple[str, list[str]]]:
    """(kind, lines): heading, code, table, item or paragraph, in order."""
    lines, i = markdown.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if line.startswith("```"):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
            end = len(lines) if end is None else end
            yield "code", lines[i + 1 : end]
            i = end + 1
            continue
        kind = "heading" if line.startswith("#") else "table" if line.startswith("|") else None
        kind = kind or ("item" if _ITEM.match(line) else "paragraph")
        j = i + 1
        while j < len(lines) and kind != "heading" and _continues(kind, lines[j]):
            j += 1
        yield kind, lines[i:j]
        i = j


def _continues(kind: str, line: str) -> bool:
    """Whether ``line`` goes on a block of ``kind`` (not a blank, heading, fence or new item)."""
    if not line.strip() or line.startswith(("#", "```")):
        return False
    if kind == "table":
        return line.startswith("|")
    return not _ITEM.match(line) and not line.startswith("|")


def roff(markdown: str) -> list[str]:
    """Roff lines for ``markdown`` (headings of level 2 and 3; a level-1 title is dropped)."""
    out: list[str] = []
    for kind, lines in _blocks(markdown):
        text = " ".join(x.strip() for x in lines)
        if kind == "heading":
            level = len(text) - len(text.lstrip("#"))
            out += [_heading(level, text.lstrip("#").strip())] if level > 1 else []
        elif kind == "code":
            out += [".PP", ".RS 2", ".nf", *(_line(esc(x)) for x in lines), ".fi", ".RE"]
        elif kind == "table":
            out += _table(lines)
        elif kind == "item":
            m = _ITEM.match(text)
            assert m is not None
            mark = "\\(bu" if m.group(1) else f"{m.group(2)}."
            out += [f".IP {mark} 4", _line(inline(m.group(3)))]
        else:
            out += [".PP", _line(inline(text))]
    return out
