"""The common shell of our console scripts: run a click group, turn errors into exit codes.

Every failure becomes one line on stderr (through the caller's `report`) and an
exit code — 2 for usage and configuration errors, 1 for runtime errors, 130 for
an interrupt — never a traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import click

from pepsi_dispatch import __version__
from pepsi_dispatch.errors import PepsiError, UsageError

#: ``-c FILE``, the same in every tool; the value arrives as ``config_path``.
config_option = click.option(
    "-c",
    "--config",
    "config_path",
    metavar="FILE",
    help="Configuration file (default: $PEPSI_CONFIG, ~/.config/pepsi.conf, /etc/pepsi.conf).",
)


def version_option(prog: str) -> Callable:
    """``-v``, ``-V`` and ``--version``, the same in every tool: prints ``PROG VERSION``."""
    return click.version_option(
        __version__, "-v", "-V", "--version", prog_name=prog, message="%(prog)s %(version)s"
    )


def _misplaced(exc: click.UsageError) -> str:
    """For a group's option given after its command: where it goes (else '')."""
    ctx = exc.ctx
    if not isinstance(exc, click.NoSuchOption) or ctx is None or ctx.parent is None:
        return ""
    names = {n for p in ctx.parent.command.params for n in (*p.opts, *p.secondary_opts)}
    if exc.option_name not in names:
        return ""
    cmd = ctx.info_name
    return f"{exc.option_name} is not an option of '{cmd}' but a global one: give it before '{cmd}'"


def run_click(
    group: click.Group,
    prog: str,
    argv: Sequence[str],
    report: Callable[[str], None],
    on_other_error: Callable[[Exception], int] | None = None,
) -> int:
    """Run `group` on `argv` and return the process exit code.

    `on_other_error` handles any other exception (reporting it and returning the
    exit code); without it such an exception propagates.
    """
    try:
        rv = group.main(args=list(argv), prog_name=prog, standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except (click.Abort, KeyboardInterrupt):
        return 130
    except click.UsageError as exc:
        report(f"{_misplaced(exc) or exc.format_message()} (see '{prog} -h')")
        return 2
    except click.ClickException as exc:
        report(exc.format_message())
        return exc.exit_code
    except PepsiError as exc:
        report(str(exc))
        return 2 if isinstance(exc, UsageError) else 1
    except Exception as exc:
        if on_other_error is None:
            raise
        return on_other_error(exc)
    return rv if isinstance(rv, int) else 0
