"""claim_lines v1: the claim also returns each row as the line a worker reads.

A stage program on the SDK read every batch of ids it was handed with its own
pepsi.get_messages round trip: at the shipped stage defaults (QUEUE_LIMIT 4)
one statement of three per four messages, on the critical path of every
refill. pepsi.claim_lines claims exactly as pepsi.claim does and, for the
stages the dispatcher asks it to, returns each claimed row (id, stage,
retries, payload, state) as one tab-separated line, read after the claim so
it is the row as claimed. The dispatcher hands that line instead of the bare
id to workers that said they take rows on their pipe (the in-hand slot's
capability word); other workers get the bare id, as before.

* claim_lines v1: claim v8's body, with line_limits and the line column
  (the line is made in the UPDATE's RETURNING: the row as claimed).
* claim v9: a wrapper of claim_lines without lines (same signature, result
  and settings), so that the claim's body lives in one file.

grants.v7.sql grants claim_lines to pepsi_dispatcher. Downgrade installs
claim v8 again, drops claim_lines and runs grants.v6.sql again.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-03
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

SIGNATURE = "pepsi.claim_lines(bigint, text[], integer[], boolean, bigint[], integer[])"


def upgrade() -> None:
    install(op, "claim_lines", 1)
    install(op, "claim", 9)
    run(op, "grants", 7)


def downgrade() -> None:
    install(op, "claim", 8)
    op.execute(f"DROP FUNCTION {SIGNATURE}")
    run(op, "grants", 6)
