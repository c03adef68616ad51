"""What an operator reads of a message is true.

Why: a careful operator's first week found three things that read wrong.

* message_history: after a message's last recorded attempt at stage
  ingest, show said "ingest advanced to store" although it went through
  enrich (successes are not recorded); now "ingest left, now at stage
  store".
* requeue_due: state.pause_reason outlived the pause, so a done message
  still carried it (the dashboard showed it); a row made pending loses it
  (the reason stays in pepsi.attempts).
* fire_schedule, _reserved_state_keys: a scheduled message says which
  schedule made it (state.scheduled_by, reserved like scheduled_for).

* _reserved_state_keys v2 (was v1)
* fire_schedule v3 (was v2)
* message_history v3 (was v2)
* requeue_due v6 (was v5)

Revision ID: 0031
Revises: 0030
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install(op, "_reserved_state_keys", 2)
    install(op, "fire_schedule", 3)
    install(op, "message_history", 3)
    install(op, "requeue_due", 6)


def downgrade() -> None:
    install(op, "requeue_due", 5)
    install(op, "message_history", 2)
    install(op, "fire_schedule", 2)
    install(op, "_reserved_state_keys", 1)
