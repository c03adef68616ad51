"""A row whose state is near the jsonb size limit never stays running.

`state || jsonb_build_object('dispatch_error', ...)` raises
program_limit_exceeded (54000) when the state is near jsonb's 255 MB limit.
The dispatcher's writes that add such a note failed as a whole, and the row
stayed 'running' (or, for requeue_due, no due row moved again):

* record_dispatch_error v4, check_answered v3, requeue_due v4: the set-based
  UPDATE is unchanged.  Only when it raises program_limit_exceeded, each
  candidate row's new state is built in a block of its own, and the UPDATE
  runs again with the state of the rows that failed left as it is (status,
  timeout and dispatcher_id still change; a WARNING names each such row).
  Still one statement: one subtransaction per call, none per row.

Same signatures and result types: CREATE OR REPLACE keeps the grants.
Downgrade installs record_dispatch_error v3, check_answered v2 and
requeue_due v3.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-30
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install(op, "record_dispatch_error", 4)
    install(op, "check_answered", 3)
    install(op, "requeue_due", 4)


def downgrade() -> None:
    install(op, "requeue_due", 3)
    install(op, "check_answered", 2)
    install(op, "record_dispatch_error", 3)
