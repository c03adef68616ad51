"""The dispatcher's start-up against its database (connect, lock, register)."""

from __future__ import annotations

import logging

from pepsi_dispatch.config import Config, apply_overlay
from pepsi_dispatch.contract import SCHEMA_FLOOR
from pepsi_dispatch.coordinator.checks import overlay_program_problems
from pepsi_dispatch.coordinator.database.link import error_line
from pepsi_dispatch.coordinator.database.port import (
    SCHEMA_MISSING,
    DispatchStore,
    NotPermitted,
    StoreError,
)
from pepsi_dispatch.errors import FatalError, UsageError

log = logging.getLogger(__name__)


def require_schema_floor(db: DispatchStore) -> None:
    """Refuse (exit 2) a database whose schema is older than this code's
    :data:`~pepsi_dispatch.contract.SCHEMA_FLOOR`: no code path serves an older one."""
    version = db.schema_version()
    revisions = (version or "").split(",")
    if version is None or max(revisions) < SCHEMA_FLOOR:
        raise UsageError(
            f"database {db.dbname()!r} is at schema revision {version or 'none'}; this"
            f" pepsi-dispatch needs {SCHEMA_FLOOR} or later: run 'pepsi-queue migrate'"
            " (or 'alembic upgrade head' in a checkout) with PEPSI_DSN set to it, then start"
            " again"
        )


def open_database(db: DispatchStore, config: Config) -> tuple[Config, int]:
    """Connect, lock, LISTEN, read the overlay, register, reset orphans, register the stages.

    Returns the configuration with the database overlay applied and our
    dispatcher id. Raises UsageError (exit 2) when another dispatcher holds
    the database, the schema is missing or the overlay is bad; FatalError
    (exit 1) on other database errors.
    """
    dc = config.dispatch
    try:
        db.connect()
    except StoreError as exc:
        raise FatalError(f"cannot connect to the database: {error_line(exc)}") from None
    try:
        if not db.try_lock():
            holders = db.lock_holders()
            mode = "competing " if dc.competing else ""
            raise UsageError(
                f"another dispatcher already serves this database ({holders}); "
                f"this {mode}dispatcher refuses to start"
                + (
                    " (a single dispatcher and competing replicas cannot be mixed)"
                    if dc.competing
                    else ""
                )
            )
        # LISTEN first, before the overlay is read and before we register:
        # nothing enqueued and no overlay change made after this is missed. (A
        # change made between this LISTEN and the read below is read *and*
        # notified; the reload it causes finds nothing new.) Registering is
        # what tells the outside world we are up, so it comes after.
        require_schema_floor(db)
        db.start_listening()
        # The overlay applies at start-up too; a bad one is a configuration error (exit 2).
        file_config, config = config, apply_overlay(config, db.overlay())
        for problem in overlay_program_problems(file_config, config):
            log.warning("%s; the stage is held off until then", problem)
        dispatcher_id = db.register()
        n = db.reset_orphans(dispatcher_id, dc.orphan_timeout)
        db.register_stages(dispatcher_id, config.stages.values())
    except SCHEMA_MISSING:
        raise UsageError(
            f"database {db.dbname()!r} has no (current) pepsi schema:"
            " run 'pepsi-queue migrate' (or 'alembic upgrade head' in a checkout)"
            " with PEPSI_DSN set to it"
        ) from None
    except NotPermitted as exc:
        user = db.role()
        raise UsageError(
            f"role {user} may not dispatch in database {db.dbname()!r}"
            f" ({exc.diag.message_primary or error_line(exc)}): GRANT pepsi_dispatcher TO {user}"
            " as the schema owner; 'serve --check' lists what it lacks"
        ) from None
    except StoreError as exc:
        raise FatalError(f"database error during start-up: {error_line(exc)}") from None
    if n:
        log.info("reset %d orphaned running row(s) to pending", n)
    _warn_about(config)
    return config, dispatcher_id


def _warn_about(config: Config) -> None:
    dc = config.dispatch
    if dc.competing and dc.shutdown_timeout >= dc.orphan_timeout:
        log.warning(
            "SHUTDOWN_TIMEOUT (%g s) >= ORPHAN_TIMEOUT (%g s): should this replica's"
            " heartbeat stall while it stops (database trouble), other replicas reset"
            " and run again rows its workers are still finishing; keep SHUTDOWN_TIMEOUT"
            " below ORPHAN_TIMEOUT",
            dc.shutdown_timeout,
            dc.orphan_timeout,
        )
    if dc.db_pool_size < 2:
        log.warning(
            "DB_POOL_SIZE = %d, but the dispatcher needs its 2 connections"
            " (LISTEN + work); using 2",
            dc.db_pool_size,
        )


__all__ = ["open_database"]
