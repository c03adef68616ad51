"""finish_many v1: pepsi.finish for a batch of ids in one statement.

A batch worker (one statement per batch of buffered ids) finished each id with
pepsi.finish over unnest(ids): a PL/pgSQL call and an UPDATE per id. finish_many
is one UPDATE over `workqueue_id = ANY(ids)`, returning the ids it finished.
New function only: nothing existing changes. Granted to pepsi_stage like
pepsi.finish (EXECUTE revoked from PUBLIC, as in grants.v1.sql). Downgrade
drops it.

It depends on nothing newer than 0006's finish v2 predicate.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

SIGNATURE = "pepsi.finish_many(bigint[], text, bigint)"


def upgrade() -> None:
    install(op, "finish_many", 1)
    op.execute(f"REVOKE ALL ON FUNCTION {SIGNATURE} FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO pepsi_stage")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SIGNATURE}")
