"""The ``pepsi-dispatch`` command line.

``pepsi-dispatch [-c FILE] [-L LEVEL] [-l LOGFILE] [-v|-V|--version] [-h] serve [--check]``

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
from typing import TYPE_CHECKING

import click

from pepsi_dispatch.cli.logsetup import logs_to_file, parse_level, setup_logging
from pepsi_dispatch.cli.shell import config_option, run_click, version_option
from pepsi_dispatch.coordinator import earlysignals

if TYPE_CHECKING:
    from pepsi_dispatch.coordinator import checks

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
    help="Log level: DEBUG, INFO, WARNING, ERROR or NONE (also BULK, MESSAGE, WARN).",
)
@click.option("-l", "--logfile", metavar="LOGFILE", help="Append the log here instead of stderr.")
@version_option(PROG)
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, level: str, logfile: str | None) -> None:
    """Global options; the work is done by the ``serve`` subcommand."""
    if ctx.invoked_subcommand is None:
        raise click.UsageError("missing command; the only command is 'serve'", ctx)
    parse_level(level)  # a bad -L is a usage error before anything else happens
    ctx.obj = _Options(config_path, level, logfile)


@cli.command(help="Run the dispatcher until SIGINT/SIGTERM.")
@click.option(
    "--check",
    is_flag=True,
    help="Run every start-up check (configuration, each PROGRAM and its interpreter"
    " as SERVICE_USER, database, schema at head, grants), print the results and"
    " exit 0 or 2 without serving.",
)
@click.pass_obj
def serve(opts: _Options, check: bool) -> int:
    """Load the configuration, set up logging, drop root, check, then run the event loop."""
    from pepsi_dispatch.config import ConfigError, load_config
    from pepsi_dispatch.coordinator import checks
    from pepsi_dispatch.coordinator.privileges import drop_privileges

    if check:
        return _check(opts)
    config = load_config(opts.config)
    setup_logging(opts.level, opts.logfile, config.dispatch.log_format)
    log.debug("configuration: %s", config.path or "built-in defaults")
    problem = checks.no_config_problem(config)
    if problem:
        raise ConfigError(problem)
    # Import the whole serving code while still root: after the drop, the service
    # user may not be able to read the interpreter's library (a Python under /root).
    import pepsi_dispatch.coordinator.dispatcher as dispatcher_module
    from pepsi_dispatch.coordinator.database.preflight import session_problem

    drop_privileges(config.dispatch.service_user)
    bad = [c for c in checks.program_checks(config) if not c.ok]
    if bad:
        raise ConfigError("; ".join(f"{c.name}: {c.detail}" for c in bad))
    pooled = session_problem(config.dsn)
    if pooled:
        raise ConfigError(pooled)
    rc = dispatcher_module.serve(config)
    return 0 if rc is None else int(rc)


def _service_user_check(service_user: str) -> checks.Check:
    """The ``service user`` check after the privilege drop: who we run as."""
    from pepsi_dispatch.coordinator import checks

    me = checks.current_user()
    not_used = "" if me == service_user else f" (not root: SERVICE_USER {service_user} not used)"
    return checks.Check("service user", True, f"running as {me}{not_used}")


def _check(opts: _Options) -> int:
    """``serve --check``: each check's result on stdout; 0 if all pass, else 2."""
    from pepsi_dispatch.config import ConfigError, load_config
    from pepsi_dispatch.coordinator import checks
    from pepsi_dispatch.coordinator.database import preflight
    from pepsi_dispatch.coordinator.privileges import config_files, drop_privileges
    from pepsi_dispatch.errors import PepsiError

    results: list[checks.Check] = []

    def done() -> int:
        failed = [c for c in results if not c.ok]
        for c in results:
            click.echo(c.line())
        if failed:
            click.echo(f"{PROG}: {len(failed)} of {len(results)} check(s) failed")
            return 2
        warned = sum(c.warn for c in results)
        also = f" ({warned} warning{'s' if warned > 1 else ''})" if warned else ""
        click.echo(f"{PROG}: all {len(results)} checks passed{also}")
        return 0

    try:
        config = load_config(opts.config)
    except ConfigError as exc:
        results.append(checks.Check("configuration", False, str(exc)))
        return done()
    setup_logging(opts.level, opts.logfile, config.dispatch.log_format)
    problem = checks.no_config_problem(config)
    results.append(
        checks.Check(
            "configuration",
            problem is None,
            problem or f"{config.path or 'built-in defaults'}: {len(config.stages)} stage(s)",
        )
    )
    try:
        from pepsi_dispatch.schema.migrate import head_revision

        logging.getLogger("alembic").setLevel(logging.WARNING)  # its plugin chatter
        head: str | None = head_revision()  # read while still root
    except Exception as exc:  # noqa: BLE001 -- reported as a failed check
        head = None
        results.append(checks.Check("migrations", False, f"cannot read them: {exc}"))
    import psycopg  # noqa: F401 -- imported while still root, like serve

    results.extend(checks.unit_read_checks(config_files(config), config.dispatch.service_user))
    try:
        drop_privileges(config.dispatch.service_user)
    except PepsiError as exc:
        results.append(checks.Check("service user", False, str(exc)))
        return done()
    results.append(_service_user_check(config.dispatch.service_user))
    results.extend(checks.program_checks(config))
    results.extend(preflight.database_checks(config.dsn, head))
    results.extend(preflight.overlay_checks(config))
    results.extend(preflight.worker_dsn_checks(config))
    return done()


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
