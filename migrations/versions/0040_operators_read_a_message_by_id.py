"""Operators read a message by id with the function a stage uses.

Why: pepsi_operator is people's role to read the queue, and the contract
names get_message among the functions that read messages wherever they are
kept; an operator calling it got "permission denied". pepsi_operator may
already SELECT the tables, so this grants nothing it could not read.

* grants v15 (was v14): get_message and get_messages to pepsi_operator

Revision ID: 0040
Revises: 0039
"""

from alembic import op

from migrations.sqlfiles import run

revision = "0040"
down_revision = "0039"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run(op, "grants", 15)


def downgrade() -> None:
    run(op, "grants", 14)
