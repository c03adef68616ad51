"""claim v2: update the picked rows by primary key, not by a join.

v1 joined the UPDATE to a materialized CTE of picked ids; with a backlog
(460,000 pending of 1,000,000 rows) the planner hash-joined it over a
sequential scan of the table, ~140 ms per claim.  v2 passes the pick as an
array to `workqueue_id = ANY(...)`: a primary-key index scan, ~1 ms.
Numbers and plans in migrations/sql/functions/claim.v2.sql.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Same signature: CREATE OR REPLACE keeps the grants of 0001.
    install(op, "claim", 2)


def downgrade() -> None:
    install(op, "claim", 1)
