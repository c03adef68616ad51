"""reschedule refuses a running message at once

Why: reschedule locked the row FOR UPDATE before it looked at its status,
and a running row is locked by its worker's pin for the handler's whole
run (up to MAX_RUNTIME). So `pepsi-queue reschedule` and the dashboard's
Run now waited for the handler, holding pepsi-httpd's one session (its
/healthz and pages stalled meanwhile), and then said the message was done.
The status is now read first without a lock: a running message is refused
at once, a waiting one is locked and moved as before. A terminal message
kept in pepsi.dead_letters was "no message N"; it is now refused as
terminal, with the requeue hint, as one still in the queue is.

* reschedule v2 (was v1)

Revision ID: 0045
Revises: 0044
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0045"
down_revision = "0044"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install(op, "reschedule", 2)


def downgrade() -> None:
    install(op, "reschedule", 1)
