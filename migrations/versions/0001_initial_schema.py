"""Schema pepsi, roles, grants and version 1 of every function.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Order matters only where one object needs another: _check_stage before its
# callers, the trigger functions before the triggers, everything before grants.
FUNCTIONS = [
    "_check_stage",
    "_notify_workqueue",
    "_notify_config",
    "enqueue",
    "enqueue_many",
    "advance",
    "finish",
    "pause",
    "fail",
    "get_message",
    "get_messages",
    "set_state",
    "register_dispatcher",
    "heartbeat",
    "unregister_dispatcher",
    "claim",
    "requeue_due",
    "reset_orphans",
    "release",
    "record_dispatch_error",
    "check_answered",
    "flush_stats",
    "purge_done",
    "metrics",
    "queue_counts",
    "requeue_failed",
]


def upgrade() -> None:
    run(op, "roles", 1)
    run(op, "tables", 1)
    for name in FUNCTIONS:
        install(op, name, 1)
    run(op, "triggers", 1)
    run(op, "grants", 1)


def downgrade() -> None:
    run(op, "drop", 1)
