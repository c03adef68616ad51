"""message_story v3: pepsi-queue show prints the priority and the dedupe key.

Priorities and dedupe keys (0019) are columns of the row; `pepsi-queue show`
reads the message through message_story, which did not return them. v3 adds
`priority` and `dedupe_key` at the end of its result. The result type
changes, so v2 is dropped and the grants file at head (grants.v6.sql) is run
again to grant v3 as it granted v2.

Downgrade drops v3, installs v2 and runs grants.v6.sql again.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-01
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

SIGNATURE = "pepsi.message_story(bigint)"


def upgrade() -> None:
    op.execute(f"DROP FUNCTION {SIGNATURE}")
    install(op, "message_story", 3)
    run(op, "grants", 6)


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SIGNATURE}")
    install(op, "message_story", 2)
    run(op, "grants", 6)
