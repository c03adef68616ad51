"""requeue_due v2: exhausted and expired counts per stage.

The dispatcher counts rows that requeue_due fails with 'retries exhausted' in
stage_stats.failed (and so dispatch_stats.failed); v1 returned only totals.

The return type changes (four more OUT columns), so CREATE OR REPLACE cannot
keep the old function: v1 is dropped, v2 created and granted to
pepsi_dispatcher again (EXECUTE revoked from PUBLIC, as in grants.v1.sql).
Downgrade does the reverse.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

SIGNATURE = "pepsi.requeue_due(text[], integer[], integer, interval)"


def _grant() -> None:
    op.execute(f"REVOKE ALL ON FUNCTION {SIGNATURE} FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO pepsi_dispatcher")


def upgrade() -> None:
    op.execute(f"DROP FUNCTION {SIGNATURE}")
    install(op, "requeue_due", 2)
    _grant()


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SIGNATURE}")
    install(op, "requeue_due", 1)
    _grant()
