"""advance_many v1: pepsi.advance for a batch of ids in one statement.

A batch worker at a middle stage advanced each id with pepsi.advance over
unnest(ids): a PL/pgSQL call and an UPDATE per id. advance_many is one UPDATE
over `workqueue_id = ANY(ids)`, returning the ids it advanced, as finish_many
(0011) is for the last stage; the SDK's group commit sends its advances of one
stage to one stage through it.

New function only: nothing existing changes. Granted to pepsi_stage like
pepsi.advance and finish_many, by migrations/sql/schema/grants.v3.sql (grants.v2.sql
plus that grant), run after the function exists.

Downgrade drops it and runs grants.v2.sql again: 0014's catalog exactly.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-30
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

SIGNATURE = "pepsi.advance_many(bigint[], text, text, bigint)"


def upgrade() -> None:
    install(op, "advance_many", 1)
    run(op, "grants", 3)


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SIGNATURE}")
    run(op, "grants", 2)
