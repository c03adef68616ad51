"""Man pages pepsi-dispatch(1), pepsi-queue(1) and pepsi.conf(5), generated.

The command pages come from the click commands themselves (the text of
``--help``), pepsi.conf(5) from the option tables of docs/CONFIG.md, checked
against the option table of :mod:`pepsi_dispatch.config` (an option missing on
either side is an error). ``make man`` writes them to ``man/``; the wheel
installs those files; a test regenerates them and compares, so they cannot
drift from ``--help`` or docs/CONFIG.md.

``python -m pepsi_dispatch.cli.manpages OUTDIR [CONFIG_MD]``
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from pepsi_dispatch import __version__

__all__ = ["PAGES", "config_page", "command_page", "generate"]

_TITLE = "pepsi-dispatch " + __version__


def _esc(text: str) -> str:
    """Plain text to roff: backslashes, and a leading '.' or "'" of a line."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(("\\&" + ln if ln[:1] in (".", "'") else ln) for ln in text.split("\n"))


def _md(text: str) -> str:
    """The inline markdown of docs/CONFIG.md (code, bold, italics) to roff fonts."""
    out = _esc(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"\\fB\1\\fR", out)
    out = re.sub(r"`([^`]+)`", r"\\fB\1\\fR", out)
    out = re.sub(r"\*([^*]+)\*", r"\\fI\1\\fR", out)
    return out


def _header(name: str, section: int, summary: str) -> list[str]:
    return [
        f'.TH "{name.upper()}" "{section}" "" "{_TITLE}" "pepsi-dispatch manual"',
        ".SH NAME",
        f"{_esc(name)} \\- {_esc(summary)}",
    ]


def _params(ctx: click.Context, command: click.Command) -> list[str]:
    lines = []
    for param in command.get_params(ctx):
        if not isinstance(param, click.Option):
            continue  # arguments are in the synopsis
        record = param.get_help_record(ctx)
        if record is None:
            continue
        opts, help_text = record
        lines += [".TP", f"\\fB{_esc(opts)}\\fR", _esc(help_text or "")]
    return lines


def command_page(group: click.Group, prog: str, summary: str, extra: str = "") -> str:
    """A section-1 page: synopsis, description, options, then every subcommand."""
    ctx = click.Context(group, info_name=prog, **group.context_settings)
    usage = " ".join(group.collect_usage_pieces(ctx))
    lines = _header(prog, 1, summary)
    lines += [".SH SYNOPSIS", f"\\fB{_esc(prog)}\\fR {_esc(usage)}"]
    lines += [".SH DESCRIPTION", _esc(group.help or "")]
    lines += [".SH OPTIONS", *_params(ctx, group)]
    lines += [".SH COMMANDS"]
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None
        sub = click.Context(cmd, info_name=name, parent=ctx, **cmd.context_settings)
        pieces = " ".join(cmd.collect_usage_pieces(sub))
        lines += [".SS " + _esc(f"{name} {pieces}".strip()), _esc(cmd.help or "")]
        opts = _params(sub, cmd)
        if opts:
            lines += [".RS", *opts, ".RE"]
    if extra:
        lines += [extra.strip()]
    lines += [
        ".SH SEE ALSO",
        "\\fBpepsi\\-dispatch\\fR(1), \\fBpepsi\\-queue\\fR(1), \\fBpepsi.conf\\fR(5)",
    ]
    return "\n".join(lines) + "\n"


_EXIT = """.SH EXIT STATUS
0 after a clean shutdown (and for \\-h, \\-v, and a passing \\fBserve \\-\\-check\\fR);
2 for usage and configuration errors, including a PROGRAM the service user
cannot run and a failing \\fBserve \\-\\-check\\fR; 1 for fatal runtime errors.
Errors are one line on stderr.
.SH ENVIRONMENT
.TP
\\fBPEPSI_CONFIG\\fR
configuration file when \\-c is not given; set for every worker to the file loaded.
.TP
\\fBPEPSI_DSN\\fR
overrides [database] DSN.
.TP
\\fBNOTIFY_SOCKET\\fR, \\fBWATCHDOG_USEC\\fR, \\fBJOURNAL_STREAM\\fR
set by systemd: READY=1/STOPPING=1/WATCHDOG=1 notifications, journald log lines.
"""


def _config_tables(markdown: str) -> dict[str, list[tuple[str, str, str]]]:
    """The option tables of docs/CONFIG.md: section heading -> [(option, default, meaning)]."""
    tables: dict[str, list[tuple[str, str, str]]] = {}
    section = None
    for line in markdown.splitlines():
        m = re.match(r"## `\[([^\]]+)\]`", line)
        if m:
            section = m.group(1)
            continue
        if line.startswith("## "):
            section = None
        if section and line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            tables.setdefault(section, []).append((cells[0].strip("`"), cells[1], cells[2]))
    return tables


def config_page(markdown: str) -> str:
    """pepsi.conf(5) from docs/CONFIG.md; raises ValueError if it and config.py disagree."""
    from pepsi_dispatch.config import load as config

    tables = _config_tables(markdown)
    code = {
        "database": set(config._DATABASE_OPTIONS),
        "pepsi-dispatch": set(config._DISPATCH_OPTIONS),
        "stage-NAME": set(config._STAGE_OPTIONS),
    }
    for section, options in code.items():
        documented = {row[0] for row in tables.get(section, [])}
        if documented != options:
            raise ValueError(
                f"docs/CONFIG.md [{section}] documents {sorted(documented - options)} that"
                f" config.py lacks, and lacks {sorted(options - documented)}"
            )
    lines = _header("pepsi.conf", 5, "configuration of pepsi-dispatch and its stage graph")
    lines += [
        ".SH DESCRIPTION",
        "An INI file: \\fB[section]\\fR, \\fBKEY = value\\fR, \\fB#\\fR comments; keys",
        "and section names are case\\-insensitive; \\fB$NAME\\fR and",
        "\\fB${NAME:\\-default}\\fR are expanded from [PATHS] and the environment.",
        "Times: \\fB500 ms\\fR, \\fB30 s\\fR, \\fB5 min\\fR, \\fB24 h\\fR, \\fB2 d\\fR",
        "(a bare number is seconds).",
        ".PP",
        "Found by \\fB\\-c FILE\\fR, else \\fB$PEPSI_CONFIG\\fR, else",
        "\\fB~/.config/pepsi.conf\\fR, else \\fB/etc/pepsi.conf\\fR.",
    ]
    for section in ("database", "pepsi-dispatch", "stage-NAME"):
        lines.append(f".SH [{_esc(section)}]")
        for option, default, meaning in tables[section]:
            lines += [".TP", f"\\fB{_esc(option)}\\fR (default: {_md(default)})", _md(meaning)]
    lines += [
        ".SH SEE ALSO",
        "\\fBpepsi\\-dispatch\\fR(1), \\fBpepsi\\-queue\\fR(1)",
    ]
    return "\n".join(lines) + "\n"


PAGES = ("pepsi-dispatch.1", "pepsi-queue.1", "pepsi.conf.5")


def generate(config_md: Path) -> dict[str, str]:
    """File name -> page text."""
    from pepsi_dispatch.cli import dispatch as cli
    from pepsi_dispatch.cli import queue as queue_cli

    return {
        "pepsi-dispatch.1": command_page(
            cli.cli, cli.PROG, "coordinator of the pepsi PostgreSQL work queue", _EXIT
        ),
        "pepsi-queue.1": command_page(
            queue_cli.cli, queue_cli.PROG, "operate the pepsi work queue and its schema"
        ),
        "pepsi.conf.5": config_page(config_md.read_text(encoding="utf-8")),
    }


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path("man")
    config_md = Path(argv[1]) if len(argv) > 1 else Path("docs/CONFIG.md")
    out.mkdir(parents=True, exist_ok=True)
    for name, text in generate(config_md).items():
        (out / name).write_text(text, encoding="utf-8")
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
