"""The paused-row flip reads the retry policy from the stage registry.

* _retry_cap v1 (private): a stage's retry cap -- the stage registry's
  MAX_RETRIES (pepsi.stages) when no policy is passed, else the given arrays.
* requeue_due v5: with stages NULL the cap comes from pepsi.stages, the same
  source record_dispatch_error reads, so the dispatcher passes no policy.
  Given arrays keep their meaning (pgTAP and DBAs call it so). Same signature and result (CREATE OR
  REPLACE keeps the grants); the grants file at head is run again so the new
  helper is granted to no role.

Downgrade installs requeue_due v4 and drops the helper.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-01
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install(op, "_retry_cap", 1)
    install(op, "requeue_due", 5)
    run(op, "grants", 6)


def downgrade() -> None:
    install(op, "requeue_due", 4)
    op.execute("DROP FUNCTION pepsi._retry_cap(text, text[], integer[], integer)")
    run(op, "grants", 6)
