"""claim v4: an optional per-stage lower bound (after_ids).

The dispatcher passes, per stage, the highest id it knows was claimed with no
pending row of that stage left below it; the pick's index scan starts there
instead of walking the dead entries that claimed rows leave at the low end of
the partial pending index until VACUUM.  Numbers in migrations/sql/functions/claim.v4.sql.

The signature changes (a fifth parameter), so CREATE OR REPLACE cannot keep
the old function: the 4-argument one is dropped, the new one created and
granted to pepsi_dispatcher again (EXECUTE revoked from PUBLIC, as in
grants.v1.sql).  Downgrade does the reverse.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

V3 = "pepsi.claim(bigint, text[], integer[], boolean)"
V4 = "pepsi.claim(bigint, text[], integer[], boolean, bigint[])"


def _grant(signature: str) -> None:
    op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO pepsi_dispatcher")


def upgrade() -> None:
    op.execute(f"DROP FUNCTION {V3}")
    install(op, "claim", 4)
    _grant(V4)


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {V4}")
    install(op, "claim", 3)
    _grant(V3)
