"""Start-up: the command line and environment, the configuration, the connection,
then :class:`~.runner.StageRunner` until EOF or a stop signal."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import io
import os
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

import psycopg

from pepsi_dispatch.contract import EXIT_NO_STAGE

from .connection import EX_TEMPFAIL, ConnectionHolder, connector
from .facts import StartFacts, start_facts
from .inhand import InHand, from_environment
from .lending import (
    IDLE_MAX,
    LEND_CONNECT_TIMEOUT,
    Lender,
    give_back,
    lending_wanted,
    loan_in_hand,
    protocol_lender,
    take_lent,
)
from .message import Handler
from .pinning import Pin
from .pipe import protect_stdio
from .routing import HandlerDispatch, StageGraph
from .runner import StageRunner
from .statements import Statements
from .template import serve_if_asked, serve_or_announce
from .transaction import CommitMode

if TYPE_CHECKING:
    from pepsi_dispatch.config import Config

__all__ = ["fork_point", "leave", "main", "run"]


class _StartError(Exception):
    """The worker cannot start: print the message, exit with ``status``."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


def _parse_argv(argv: list[str]) -> argparse.Namespace:
    """``[-c CONFIG] worker``. The dispatcher's own forms are read directly:
    building the parser costs a forked worker a millisecond of CPU and some
    400 copy-on-write faults, paid again at every recycle."""
    if argv == ["worker"]:
        return argparse.Namespace(config=None, command="worker")
    if len(argv) == 3 and argv[0] in ("-c", "--config") and argv[2] == "worker":
        if not argv[1].startswith("-"):
            return argparse.Namespace(config=argv[1], command="worker")
    parser = argparse.ArgumentParser(
        prog=os.path.basename(sys.argv[0] or "stage"),
        description="pepsi-dispatch stage program (started by the dispatcher as"
        " 'PROGRAM [-c CONFIG] worker' with PEPSI_STAGE, PEPSI_DSN, PEPSI_DISPATCHER_ID).",
    )
    parser.add_argument("-c", "--config", help="pepsi.conf to read the stage graph from")
    parser.add_argument("command", choices=["worker"], help="the one subcommand: worker")
    return parser.parse_args(argv)


def _fail_start(message: str) -> int:
    print(f"pepsi worker: error: {message}", file=sys.stderr)
    return 2


def _read_environment(handlers: Mapping[str, Handler]) -> tuple[str, int | None]:
    """(stage, dispatcher id) from PEPSI_STAGE and PEPSI_DISPATCHER_ID."""
    stage = os.environ.get("PEPSI_STAGE", "")
    if not stage:
        raise _StartError("PEPSI_STAGE is not set (workers are started by pepsi-dispatch)")
    if stage not in handlers:
        known = ", ".join(sorted(handlers)) or "none"
        raise _StartError(f"this program has no handler for stage {stage} (it has: {known})")
    text = os.environ.get("PEPSI_DISPATCHER_ID", "").strip()
    try:
        return stage, int(text) if text else None
    except ValueError:
        raise _StartError(f"PEPSI_DISPATCHER_ID is not an integer: {text!r}") from None


def _start_facts(conn: psycopg.Connection) -> StartFacts:
    """:func:`~.facts.start_facts`, or a start error when the overlay is missing."""
    try:
        return start_facts(conn)
    except (psycopg.errors.UndefinedFunction, psycopg.errors.InvalidSchemaName):
        raise _StartError(
            "the database lacks pepsi.stage_config(): it is not migrated to the SDK's"
            " schema; run 'pepsi-queue migrate' (or 'alembic upgrade head' in a"
            " checkout) with PEPSI_DSN set to it"
        ) from None


def _stage_graph(
    config: Config, overlay: list[tuple[str, str, str | None]], stage: str
) -> StageGraph:
    """The graph from file plus overlay; a stage not in it starts nothing (EXIT_NO_STAGE)."""
    from pepsi_dispatch.config import ConfigError, apply_overlay

    config_name = str(config.path) if config.path else "built-in defaults"
    if overlay:
        try:
            config = apply_overlay(config, overlay)
        except ConfigError as exc:
            raise _StartError(str(exc)) from None
        config_name += " + database overlay"
    successors = {s.name: tuple(s.next) for s in config.stages.values()}
    if stage not in successors:
        # Every message would fail on its transition: touch none of them.
        raise _StartError(
            f"stage {stage} is not in the configuration ({config_name}); start the"
            " worker with the dispatcher's file (PEPSI_CONFIG or -c)",
            EXIT_NO_STAGE,
        )
    return StageGraph(successors, config_name)


def _serve(runner: StageRunner) -> int:
    runner.install_signals()
    try:
        return runner.serve()
    except psycopg.OperationalError as exc:
        # Reconnecting gave up: the batch in hand was rolled back, nothing it
        # held is done. EX_TEMPFAIL tells the dispatcher to release, not fail.
        print(
            f"pepsi worker: database connection lost, reconnecting gave up: {exc};"
            f" exiting {EX_TEMPFAIL}",
            file=sys.stderr,
        )
        return EX_TEMPFAIL


def commit_mode(group_commit: bool | None, in_hand: InHand) -> CommitMode:
    """Group commit when asked for, or by default (None) when the dispatcher
    offers the in-hand slot: then a crash is blamed on the message whose handler
    ran, not on the batch's first, innocent message. Without the slot (an
    older dispatcher, a worker started by hand) one commit per message."""
    if group_commit is None:
        group_commit = in_hand.offered
    return CommitMode.GROUP if group_commit else CommitMode.PER_MESSAGE


def _start(handlers: Mapping[str, Handler], group_commit: bool | None, argv: list[str]) -> int:
    from pepsi_dispatch.config import ConfigError, load_config

    args = _parse_argv(argv)
    stage, dispatcher_id = _read_environment(handlers)
    in_hand = from_environment()
    answer_fd, input_fd = protect_stdio()
    loan = loan_in_hand()  # forked by the stage's template: its configuration and a session
    try:
        inherited = loan.config if loan is not None else None
        config = inherited if inherited is not None else load_config(args.config)
    except ConfigError as exc:
        raise _StartError(str(exc)) from None
    connect = connector(os.environ.get("PEPSI_DSN") or config.dsn, stage)
    try:
        lent = take_lent()
        connection = ConnectionHolder(lent if lent is not None else connect(), connect)
    except psycopg.Error as exc:
        return _cannot_connect(exc)
    status = 1
    try:
        try:
            facts = _start_facts(connection.conn)
        except psycopg.OperationalError:
            if lent is None:
                raise
            # the lent session died while it waited (the server ended it): a new one
            connection.close()
            try:
                connection.conn = connect()
            except psycopg.Error as exc:
                return _cannot_connect(exc)
            facts = _start_facts(connection.conn)
        graph = _stage_graph(config, facts.overlay, stage)
        dispatch = HandlerDispatch(
            handlers, stage, graph, Statements(dispatcher_id), facts.retry_stages
        )
        dispatch.keeps_tracebacks = facts.keeps_tracebacks
        mode = commit_mode(group_commit, in_hand)
        runner = StageRunner(dispatch, connection, mode, answer_fd, input_fd, in_hand)
        runner.pin = _pin(dispatcher_id, stage, facts.pins)
        if runner.pin is None:
            # The pin reads each row again; without it, rows on the lines save a load.
            in_hand.take_rows()
        if mode is CommitMode.GROUP:
            runner.set_based = facts.set_based
        status = _serve(runner)
        return status
    finally:
        # Ending normally, the session goes back to the template that lent it
        # (reset), for the next worker; otherwise it is closed.
        if status != 0 or not give_back(connection.conn):
            connection.close()


def _pin(dispatcher_id: int | None, stage: str, may_pin: bool) -> Pin | None:
    """The check before each handler starts (sdk/pinning.py): with a dispatcher
    id, when the database has ``pepsi.pin_messages``; without, None (said once)."""
    if dispatcher_id is None:
        return None
    if not may_pin:
        print(
            "pepsi worker: the database lacks pepsi.pin_messages (or this role may not"
            " call it): handlers start without checking that the row is still this"
            " dispatcher's; migrate the database ('pepsi-queue migrate')",
            file=sys.stderr,
        )
        return None
    return Pin(dispatcher_id, stage)


def _cannot_connect(exc: psycopg.Error) -> int:
    """Say why the worker could not connect; its exit status (EX_TEMPFAIL when the
    server is out of reach: the dispatcher releases, not fails, what it holds)."""
    print(f"pepsi worker: cannot connect to the database: {exc}", file=sys.stderr)
    return EX_TEMPFAIL if isinstance(exc, psycopg.OperationalError) else 1


def _template_lender(argv: list[str], handlers: Mapping[str, Handler]) -> Lender | None:
    """In the stage's template: what lends database sessions to the workers it
    forks (sdk/lending.py), with the configuration they would each read; None
    when lending is switched off (``PEPSI_WORKER_LEND_SESSIONS=0``) or the
    configuration cannot be read here (each worker then reports it)."""
    from pepsi_dispatch.config import ConfigError, load_config

    stage = os.environ.get("PEPSI_STAGE", "")
    if not stage or not lending_wanted():
        return None
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = _parse_argv(argv)
        config = load_config(args.config)
    except (SystemExit, ConfigError, OSError):
        return None
    dsn = os.environ.get("PEPSI_DSN") or config.dsn
    stage_config = config.stages.get(stage)
    idle_max = IDLE_MAX if stage_config is None else min(IDLE_MAX, stage_config.parallelism + 1)
    return Lender(
        connector(dsn, stage, LEND_CONNECT_TIMEOUT),
        config,
        idle_max=idle_max,
        rehearse=lambda conn: _rehearse(conn, handlers),
    )


def _rehearse(conn: psycopg.Connection, handlers: Mapping[str, Handler]) -> None:
    """In the template, on the first session it opens: ask the start facts once,
    as each worker will, so that psycopg's caches for that statement (the
    parsed query, the dumpers and loaders of its types) are built here and
    every forked worker inherits them (about 0.7 ms of CPU and 170
    copy-on-write faults less per worker); then keep them out of the
    collector's sight, as the imports are."""
    facts = start_facts(conn)
    try:
        stage, dispatcher_id = _read_environment(handlers)
    except _StartError:
        dispatcher_id = None  # each worker says why it cannot start
    if facts.pins and dispatcher_id is not None:
        # Each batch's first statement: pinning no ids locks nothing, and is rolled back.
        Pin(dispatcher_id, stage).begin(conn, [])
        conn.execute("ROLLBACK")
    gc.freeze()


def main(handlers: Mapping[str, Handler], group_commit: bool | None, argv: list[str]) -> int:
    """Start the worker and serve; the exit status (see :func:`run`).

    Started as a template (``PEPSI_TEMPLATE_FD``), the process forks workers on
    the dispatcher's request instead; each forked worker goes on here."""
    import pepsi_dispatch.config  # noqa: F401 - what every worker reads first, imported before a template forks

    status = serve_if_asked(lambda: _template_lender(argv, handlers))
    if status is not None:
        return status
    try:
        return _start(handlers, group_commit, argv)
    except _StartError as exc:
        _fail_start(str(exc))
        return exc.status


def run(
    handlers: Mapping[str, Handler],
    group_commit: bool | None = None,
    argv: list[str] | None = None,
) -> None:
    """Run this program as a pepsi-dispatch worker; never returns (exits the process).

    Args:
        handlers: stage name → handler. The handler of ``$PEPSI_STAGE`` serves the
            ids read from stdin; the others are used when a handler fuses into them.
        group_commit: process the ids already waiting on stdin in one transaction
            and commit once (answers are sent after the commit). ``None`` (the
            default): group commit when the dispatcher offers exact crash blame
            (the in-hand slot, ``PEPSI_INHAND_FD``), one commit per message
            otherwise. ``True``/``False`` force either.
        argv: command line (default ``sys.argv[1:]``): ``[-c CONFIG] worker``.

    Exit status: 0 after EOF or SIGTERM/SIGINT, 2 for usage or configuration
    errors, 75 (EX_TEMPFAIL) when the database cannot be reached (at start, or
    reconnecting gave up after PEPSI_WORKER_RECONNECT_TIMEOUT), 78 (EX_CONFIG)
    when ``$PEPSI_STAGE`` is not a stage of the configuration found (no message
    is touched), 1 for other fatal errors.
    """
    try:
        status = main(handlers, group_commit, sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # a handler's sys.exit(), answered by the runner
        status = _exit_status(exc.code)
    leave(status)


def _exit_status(code: object) -> int:
    """The exit status ``sys.exit(code)`` would give (a text is printed, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def fork_point() -> None:
    """For programs that speak the pipe protocol themselves: call it once the
    program's modules are imported, before it connects or reads stdin.

    In a worker it returns at once, having said (in the in-hand slot's
    capability word) that the program can be its stage's template. The
    dispatcher then starts the program once more as the template: there the
    call never returns -- it forks each new worker of the stage, and each
    forked worker returns from it and goes on as a worker started by exec
    would -- and the template process exits when the dispatcher closes it.
    A worker that connects with :func:`~.lending.connect` and ends with
    ``leave(0, conn)`` passes its database session on to its replacement.
    """
    serve_or_announce(protocol_lender)


def leave(status: int, conn: psycopg.Connection | None = None) -> None:
    """End the worker process with ``status`` without tearing the interpreter down.

    ``conn``: the program's connection (from :func:`~.lending.connect`). With
    status 0 and the connection idle, its session is reset and given back to
    the stage's template for the next worker; otherwise it is closed.

    What ``sys.exit`` does at the end that matters is done here: the program's
    own threads are waited for, its ``atexit`` functions run and stdout and
    stderr are flushed. What is skipped is the teardown of every module and
    object, which writes to each of them: in a worker forked from its stage's
    template that copies nearly every page shared with the template, about
    30 ms of CPU per recycled worker, for nothing (multiprocessing's forked
    children end the same way). ``run()`` ends this way; a program that speaks
    the protocol itself and calls ``fork_point()`` should too.
    """
    main_thread = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main_thread and not thread.daemon:
            thread.join()
    if conn is not None and not (status == 0 and give_back(conn)):
        try:
            conn.close()
        except psycopg.Error:
            pass
    # The atexit functions run through CPython's own hook (what the interpreter
    # calls at exit; the module has no public name for it). An interpreter
    # without it ends the usual way, teardown and all.
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if run_exitfuncs is None:
        sys.exit(status)
    run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
