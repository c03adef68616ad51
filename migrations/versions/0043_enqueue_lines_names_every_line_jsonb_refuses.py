"""enqueue_lines names every line jsonb refuses

Why: a line with a number jsonb cannot hold (1e999999), or one too large or
nested too deeply for jsonb, made the whole call fail with PostgreSQL's own
error and no line number, where a line that is not JSON is named. Bulk
enqueue promises that a bad line is reported with its number; now it is,
with the error's own SQLSTATE (22003, 54000, 54001).

* enqueue_lines v2 (was v1)

Revision ID: 0043
Revises: 0042
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0043"
down_revision = "0042"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install(op, "enqueue_lines", 2)


def downgrade() -> None:
    install(op, "enqueue_lines", 1)
