"""claim v3: plans that do not depend on fresh statistics.

The pick orders by (stage, workqueue_id), the partial pending index's own
order, and the UPDATE's pending re-check no longer matches that index's
predicate, so a bulk enqueue into a table analyzed while empty no longer
makes each claim scan the whole pending index (~14 ms -> ~0.8 ms for 20,000
pending rows).  Numbers in migrations/sql/functions/claim.v3.sql.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Same signature: CREATE OR REPLACE keeps the grants of 0001.
    install(op, "claim", 3)


def downgrade() -> None:
    install(op, "claim", 2)
