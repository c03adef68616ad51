"""The ``pepsi-dispatch`` command line.

``pepsi-dispatch [-c FILE] [-L LEVEL] [-l LOGFILE] [-v|--version] [-h] serve``

Exit codes: 0 clean shutdown (and -h/-v); 2 usage or configuration errors
(:class:`pepsi_dispatch.errors.UsageError`, click usage errors), reported as one
``pepsi-dispatch: error: ...`` line on stderr; 1 fatal runtime errors
(:class:`pepsi_dispatch.errors.FatalError` and anything unexpected), also one line.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import click

from pepsi_dispatch import __version__, earlysignals
from pepsi_dispatch.clirun import config_option, run_click
from pepsi_dispatch.logsetup import logs_to_file, parse_level, setup_logging

__all__ = ["PROG", "cli", "main"]

PROG = "pepsi-dispatch"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Options:
    config: str | None
    level: str
    logfile: str | None


@click.group(
    name=PROG,
    context_settings={"help_option_names": ["-h", "--help"]},
    invoke_without_command=True,
    help="Coordinator of the pepsi PostgreSQL work queue: run it as 'pepsi-dispatch serve'.",
)
@config_option
@click.option(
    "-L",
    "--log-level",
    "level",
    metavar="LEVEL",
    default="INFO",
    show_default=True,
    help="Log level: DEBUG, INFO, WARNING or ERROR.",
)
@click.option("-l", "--logfile", metavar="LOGFILE", help="Append the log here instead of stderr.")
@click.version_option(
    __version__, "-v", "--version", prog_name=PROG, message="%(prog)s %(version)s"
)
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, level: str, logfile: str | None) -> None:
    """Global options; the work is done by the ``serve`` subcommand."""
    if ctx.invoked_subcommand is None:
        raise click.UsageError("missing command; the only command is 'serve'", ctx)
    parse_level(level)  # a bad -L is a usage error before anything else happens
    ctx.obj = _Options(config_path, level, logfile)


@cli.command(help="Run the dispatcher until SIGINT/SIGTERM.")
@click.pass_obj
def serve(opts: _Options) -> int:
    """Load the configuration, set up logging, drop root, then run the event loop."""
    from pepsi_dispatch.config import load_config
    from pepsi_dispatch.privileges import drop_privileges

    config = load_config(opts.config)
    setup_logging(opts.level, opts.logfile)
    log.debug("configuration: %s", config.path or "built-in defaults")
    # Import the whole serving code while still root: after the drop, the service
    # user may not be able to read the interpreter's library (a Python under /root).
    import pepsi_dispatch.loop as loop_module

    drop_privileges(config.dispatch.service_user)
    rc = loop_module.serve(config)
    return 0 if rc is None else int(rc)


def _report(message: str) -> None:
    """One line on stderr; also into the log file when logging goes to a file."""
    line = " ".join(message.split())
    print(f"{PROG}: error: {line}", file=sys.stderr, flush=True)
    if logs_to_file():
        log.error("%s", line)


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns the exit code (never raises, never a traceback)."""

    def internal_error(exc: Exception) -> int:  # a bug or an unforeseen runtime failure
        log.debug("unexpected error", exc_info=True)
        _report(f"internal error: {type(exc).__name__}: {exc} (run with -L DEBUG for details)")
        return 1

    # First: a SIGHUP/SIGTERM while we import, load the config and drop root is
    # recorded, not fatal; the loop takes it over (a reload, a clean stop).
    old_handlers = earlysignals.install()
    try:
        args = sys.argv[1:] if argv is None else argv
        return run_click(cli, PROG, args, _report, internal_error)
    finally:
        earlysignals.restore(old_handlers)


if __name__ == "__main__":
    sys.exit(main())
