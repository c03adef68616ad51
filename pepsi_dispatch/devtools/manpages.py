"""Man pages pepsi-dispatch(1), pepsi-queue(1), pepsi-httpd(1) and pepsi.conf(5), generated.

The command pages come from the click commands themselves (the text of
``--help``: every option of the program and of each subcommand) plus an EXIT
STATUS and an ENVIRONMENT section each (pepsi-httpd's also its ENDPOINTS and
HEALTH CHECK); pepsi.conf(5) is the whole of docs/CONFIG.md (mdroff.py), whose
option tables are checked against the options the programs read
(:mod:`pepsi_dispatch.config`, pepsi-httpd's ``CONFIG_OPTIONS``; an option
missing on either side is an error). Every page's SEE ALSO names the other
three. ``make man`` writes them to ``man/``; the wheel installs those files
under ``share/man``; a test regenerates them and compares, so they cannot
drift from ``--help`` or docs/CONFIG.md. (A developer tool: it imports every
program, pepsi-httpd included, so it sits above them all.)

``python -m pepsi_dispatch.devtools.manpages OUTDIR [CONFIG_MD]``
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from pepsi_dispatch import __version__
from pepsi_dispatch.devtools import mdroff

__all__ = ["PAGES", "config_page", "command_page", "generate"]

_TITLE = "pepsi-dispatch " + __version__
PAGES = ("pepsi-dispatch.1", "pepsi-queue.1", "pepsi-httpd.1", "pepsi.conf.5")


def _see_also(page: str) -> list[str]:
    """SEE ALSO: the other three pages."""
    refs = []
    for other in PAGES:
        if other == page:
            continue
        name, section = other.rsplit(".", 1)
        refs.append(f"\\fB{_esc(name)}\\fR({section})")
    return [".SH SEE ALSO", ", ".join(refs)]


def _esc(text: str) -> str:
    """Plain text to roff: backslashes, hyphens, non-ASCII, and a leading '.' or "'"."""
    text = mdroff.esc(text)
    return "\n".join(("\\&" + ln if ln[:1] in (".", "'") else ln) for ln in text.split("\n"))


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


def command_page(command: click.Command, prog: str, summary: str, extra: str = "") -> str:
    """A section-1 page: synopsis, description, options, every subcommand of a
    group, then ``extra`` (EXIT STATUS, ENVIRONMENT, ...) and SEE ALSO."""
    ctx = click.Context(command, info_name=prog, **command.context_settings)
    lines = _header(prog, 1, summary)
    lines += [".SH SYNOPSIS", *_synopsis(ctx, command, prog)]
    lines += [".SH DESCRIPTION", _esc(command.help or "")]
    lines += [".SH OPTIONS", *_params(ctx, command)]
    if isinstance(command, click.Group):
        lines += _subcommands(ctx, command)
    if extra:
        lines += [extra.strip()]
    lines += _see_also(f"{prog}.1")
    return "\n".join(lines) + "\n"


def _synopsis(ctx: click.Context, command: click.Command, prog: str) -> list[str]:
    """The usage line; for a group, one per subcommand (``prog [OPTIONS] name ...``)."""
    if not isinstance(command, click.Group):
        return [f"\\fB{_esc(prog)}\\fR {_esc(' '.join(command.collect_usage_pieces(ctx)))}"]
    lines = []
    for name in command.list_commands(ctx):
        cmd = command.get_command(ctx, name)
        assert cmd is not None
        sub = click.Context(cmd, info_name=name, parent=ctx, **cmd.context_settings)
        pieces = _esc(" ".join(cmd.collect_usage_pieces(sub)))
        lines += [".br"] if lines else []
        lines.append(f"\\fB{_esc(prog)}\\fR [OPTIONS] \\fB{_esc(name)}\\fR {pieces}")
    return lines


def _subcommands(ctx: click.Context, group: click.Group) -> list[str]:
    lines = [".SH COMMANDS"]
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None
        sub = click.Context(cmd, info_name=name, parent=ctx, **cmd.context_settings)
        pieces = " ".join(cmd.collect_usage_pieces(sub))
        lines += [".SS " + _esc(f"{name} {pieces}".strip()), _esc(cmd.help or "")]
        opts = _params(sub, cmd)
        if opts:
            lines += [".RS", *opts, ".RE"]
    return lines


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
.TP
\\fBHOME\\fR
for \\fB~/.config/pepsi.conf\\fR.
.SH FILES
.TP
\\fB/etc/pepsi.conf\\fR, \\fB~/.config/pepsi.conf\\fR
the configuration (see \\fBpepsi.conf\\fR(5)).
.TP
\\fBshare/pepsi\\-dispatch/systemd/pepsi\\-dispatch.service\\fR
the systemd unit, under the installation prefix (a venv: \\fB/opt/pepsi/share/...\\fR).
"""

_QUEUE_EXTRA = """.SH ROLES
People use a login role that is a member of \\fBpepsi_operator\\fR: it reads the
queue, enqueues, lists, shows, requeues, cancels and purges, pauses and resumes
stages, and cannot claim, release or move a running message. An error for a missing privilege names
the role to grant. \\fBmigrate\\fR needs the schema owner (a superuser the first time).
.SH DURATIONS
\\fB\\-\\-in\\fR, \\fB\\-\\-older\\-than\\fR and \\fB\\-\\-interval\\fR take
\\fB90s\\fR, \\fB10m\\fR, \\fB1h30m\\fR, \\fB2d\\fR as well as
the configuration's \\fB5 min\\fR form; a bare number is seconds.
.SH EXIT STATUS
0 success (and for \\-h, \\-v); 2 for usage and configuration errors (a bad
payload or duration, an unknown stage, purge without a selection); 1 for
database errors, a missing privilege, an unknown message id (\\fBshow\\fR) and
ids \\fBcancel \\-\\-id\\fR or \\fBrequeue \\-\\-id\\fR could not act on (one error
line each, saying why; the ids they acted on are listed on stdout); 130 when
interrupted. Errors are one line on stderr.
.SH ENVIRONMENT
.TP
\\fBPEPSI_DSN\\fR
the database; overrides [database] DSN. Without either: \\fBpostgresql:///pepsi\\fR.
.TP
\\fBPEPSI_CONFIG\\fR
configuration file when \\-c is not given.
.TP
\\fBHOME\\fR
for \\fB~/.config/pepsi.conf\\fR.
"""

_HTTPD_EXTRA = """.SH ENDPOINTS
.TP
\\fBGET /metrics\\fR
Prometheus text: the statistics, queue depth and oldest age by stage and
status (zeros included), stage health, the dispatchers' gauges.
.TP
\\fBGET /healthz\\fR
200 \\fBok: N live dispatcher(s)\\fR, else 503 with the reason (see HEALTH CHECK).
.TP
\\fBGET /\\fR, \\fB/messages\\fR, \\fB/failures\\fR, \\fB/message/ID\\fR
the dashboard (one page; \\fB/static/NAME\\fR and \\fB/favicon.ico\\fR are its
script, style and icon, served from the package). Any other path but
\\fB/api/...\\fR is answered 404 with the dashboard's page saying so.
.TP
\\fBGET /api/...\\fR
the dashboard's JSON: \\fB/api/overview\\fR, \\fB/api/messages\\fR (with
\\fBstatus\\fR, \\fBstage\\fR, \\fBolder_than\\fR, \\fBwhere\\fR, \\fBgroup\\fR,
\\fBlimit\\fR, \\fBbefore\\fR), \\fB/api/failures\\fR (with \\fBreason\\fR,
\\fBstage\\fR), \\fB/api/message/ID\\fR, \\fB/api/schedules\\fR,
\\fB/api/bulk\\fR (with \\fBaction\\fR requeue or cancel and the list's filters:
how many messages the action would take, and the newest one's id).
.TP
\\fBPOST /api/...\\fR
the dashboard's buttons, only with \\-\\-allow\\-actions (else 403), each one
\\fBpepsi.dashboard_*\\fR function: \\fB/api/requeue\\fR and \\fB/api/cancel\\fR
\\fB{"ids": [...]}\\fR, \\fB/api/reschedule\\fR \\fB{"id": N, "in_seconds": S}\\fR;
\\fB/api/bulk\\fR \\fB{"action": A, FILTERS, "before": ID}\\fR calls
\\fBpepsi.requeue_matching\\fR or \\fBpepsi.cancel_matching\\fR on every message of
the filter below ID, as \\fBpepsi\\-queue requeue\\fR/\\fBcancel\\fR do;
\\fB/api/pause\\fR \\fB{"stage": S, "paused": true}\\fR calls
\\fBpepsi.pause_stage\\fR, as \\fBpepsi\\-queue pause\\fR does (false resumes the
stage and ends its hold\\-off at once: the Resume and Try now buttons).
.SH HEALTH CHECK
\\fB/healthz\\fR answers 200 while the database answers, at least one
registered dispatcher is live (its session connected) and some session holds
the dispatcher lock, and no stage is held off too long. Otherwise 503, with
one line saying why:
.IP \\(bu 4
\\fBdatabase unavailable: ...\\fR, or the database is not migrated (run
\\fBpepsi\\-queue migrate\\fR);
.IP \\(bu 4
\\fBno live dispatcher: ...\\fR \\- none is registered with its session connected;
.IP \\(bu 4
\\fBno dispatcher session: ...\\fR \\- no session holds the dispatcher lock
(a dispatcher killed, or reconnecting);
.IP \\(bu 4
a stage with pending messages held off (or with no worker) longer than
\\-\\-held\\-off\\-limit, else [pepsi\\-httpd] HELD_OFF_LIMIT, else 60 s, one line
per stage: \\fBstage NAME no worker for 75 s with 12 pending message(s): CAUSE\\fR.
.PP
Answers come from a snapshot at most one second old.
.SH SECURITY
Every request, read or action, must name this server in its Host header: the
listen address, localhost, 127.0.0.1, ::1, or a name given with
\\-\\-allowed\\-host (with this server's port when a port is given); anything
else is answered 421 (DNS rebinding), a missing Host 400. An Origin header must
match the Host (or an allowed name), else 403.
A connection has \\-\\-request\\-timeout seconds to deliver its whole request;
at most \\-\\-max\\-connections are open (lowered to fit the open\\-file limit),
and at the cap the connection that has waited longest for its request is
closed, so /healthz and /metrics keep answering.
.SH LOGGING
One line per record on stderr (under systemd, with the journal's priorities),
or appended to \\fB\\-l\\fR \\fILOGFILE\\fR, as \\fBpepsi\\-dispatch\\fR(1) does: the
file is created if missing and reopened when logrotate moves it.
.SH EXIT STATUS
0 after SIGINT or SIGTERM (and for \\-h, \\-v); 2 for usage and configuration
errors (a bad \\-\\-listen, an address in use, an unreadable configuration, a log
file that cannot be opened); 1 for fatal runtime errors. Errors are one line on
stderr.
.SH FILES
.TP
\\fBshare/pepsi\\-dispatch/systemd/pepsi\\-httpd.service\\fR
the systemd unit, under the installation prefix (a venv:
\\fB/opt/pepsi/share/...\\fR); its DSN comes from \\fB/etc/pepsi\\-httpd.env\\fR.
.SH ENVIRONMENT
.TP
\\fBPEPSI_DSN\\fR
the database (a login role in \\fBpepsi_dashboard\\fR); overrides [database] DSN.
.TP
\\fBPEPSI_CONFIG\\fR
configuration file when \\-c is not given. pepsi\\-httpd reads its [database]
DSN (unless PEPSI_DSN is set) and its [pepsi\\-httpd] HELD_OFF_LIMIT (see
\\fBpepsi.conf\\fR(5)), nothing else: the stage graph comes from the registry
the dispatcher writes.
.TP
\\fBHOME\\fR
for \\fB~/.config/pepsi.conf\\fR.
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


def _code_options() -> dict[str, set[str]]:
    """Per section of docs/CONFIG.md: the options the programs read there."""
    from pepsi_dispatch.config import load as config
    from pepsi_dispatch.httpd import server as httpd

    return {
        "database": set(config._DATABASE_OPTIONS),
        "pepsi-dispatch": set(config._DISPATCH_OPTIONS),
        "stage-NAME": set(config._STAGE_OPTIONS),
        "schedule-NAME": set(config._SCHEDULE_OPTIONS),
        "pepsi-httpd": set(httpd.CONFIG_OPTIONS),
    }


def check_option_tables(markdown: str) -> None:
    """Raise ValueError when an option table of docs/CONFIG.md and the code disagree."""
    tables = _config_tables(markdown)
    for section, options in _code_options().items():
        documented = {row[0] for row in tables.get(section, [])}
        if documented != options:
            raise ValueError(
                f"docs/CONFIG.md [{section}] documents {sorted(documented - options)} that"
                f" the code lacks, and lacks {sorted(options - documented)}"
            )


def config_page(markdown: str) -> str:
    """pepsi.conf(5): all of docs/CONFIG.md; raises ValueError if its option tables
    and the code disagree."""
    check_option_tables(markdown)
    intro, _, rest = markdown.partition("\n## ")
    lines = _header("pepsi.conf", 5, "configuration of pepsi-dispatch and its stage graph")
    lines += [".SH DESCRIPTION", *mdroff.roff(intro)[1:]]  # (its first line is a .PP)
    lines += mdroff.roff("## " + rest)
    lines += [
        ".SH ENVIRONMENT",
        ".TP",
        "\\fBPEPSI_CONFIG\\fR",
        "the file to read when \\fB\\-c\\fR is not given.",
        ".TP",
        "\\fBPEPSI_DSN\\fR",
        "overrides [database] DSN for every tool (dispatcher, workers, pepsi\\-queue,",
        "pepsi\\-httpd, alembic).",
        ".TP",
        "any \\fB$NAME\\fR",
        "expanded in values (after [PATHS]).",
        ".SH FILES",
        "\\fB/etc/pepsi.conf\\fR, \\fB~/.config/pepsi.conf\\fR",
    ]
    lines += _see_also("pepsi.conf.5")
    return "\n".join(lines) + "\n"


def generate(config_md: Path) -> dict[str, str]:
    """File name -> page text."""
    from pepsi_dispatch.cli import dispatch as cli
    from pepsi_dispatch.cli import queue as queue_cli
    from pepsi_dispatch.httpd import server as httpd

    return {
        "pepsi-dispatch.1": command_page(
            cli.cli, cli.PROG, "coordinator of the pepsi PostgreSQL work queue", _EXIT
        ),
        "pepsi-queue.1": command_page(
            queue_cli.cli,
            queue_cli.PROG,
            "operate the pepsi work queue and its schema",
            _QUEUE_EXTRA,
        ),
        "pepsi-httpd.1": command_page(
            httpd.cli,
            httpd.PROG,
            "metrics, health check and web dashboard of the pepsi work queue",
            _HTTPD_EXTRA,
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
