"""Schedules in the database overlay reach the dispatcher.

Why: the overlay may set [schedule-*] options and add whole schedules
(docs/CONFIG.md), but stage_config v1 returned only the [stage-*] rows,
so a schedule defined or changed only in pepsi.config never fired and
never changed. v2 returns the [schedule-*] rows too; the worker SDK
merges them like the dispatcher (it builds its graph from the stages).

* stage_config v2 (was v1)

Revision ID: 0037
Revises: 0036
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install(op, "stage_config", 2)


def downgrade() -> None:
    install(op, "stage_config", 1)
