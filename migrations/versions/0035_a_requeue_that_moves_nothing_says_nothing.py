"""A requeue that moves nothing says nothing.

Why: requeue_failed v5 moved matching dead letters back into workqueue
with an INSERT ... SELECT that ran even when no row matched, and
workqueue's statement-level insert trigger notified the dispatcher for
that empty insert. The move runs only when a dead letter matches.

* requeue_failed v6 (was v5)

Revision ID: 0035
Revises: 0034
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install(op, "requeue_failed", 6)


def downgrade() -> None:
    install(op, "requeue_failed", 5)
