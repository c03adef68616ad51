"""heartbeat v2: re-register a dispatcher a replica declared dead.

v1 raised P0002 when the registration was gone; the dispatcher takes any
database error for a lost connection, reconnects and heartbeats again, so a
replica that had been partitioned longer than ORPHAN_TIMEOUT looped forever.
See migrations/sql/functions/heartbeat.v2.sql.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Same signature: CREATE OR REPLACE keeps the grants of 0001.
    install(op, "heartbeat", 2)


def downgrade() -> None:
    install(op, "heartbeat", 1)
