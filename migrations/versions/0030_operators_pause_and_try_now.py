"""Operators pause and resume stages; resuming ends a stage's hold-off.

Why: pepsi_operator could not pause a stage at all (only the dashboard could,
through dashboard_pause_stage, and pepsi_operator may not write pepsi.config),
and nobody could end a hold-off: after fixing a PROGRAM that kept dying, its
stage waited out a cooldown of up to 60 s. pause_stage is the one function
behind `pepsi-queue pause/resume STAGE` and the dashboard's Pause, Resume and
Try now buttons: dashboard_pause_stage v2's body, plus a NOTIFY
config_changed 'try_now:STAGE' on every resume, on which each dispatcher
ends that stage's hold-off at once.

* pause_stage v1 (new; granted to pepsi_operator, pepsi_dispatcher and
  pepsi_dashboard by grants v10)
* dashboard_pause_stage dropped (pepsi-httpd calls pause_stage)
* grants v10 (was v9)

Downgrade drops pause_stage, installs dashboard_pause_stage v2 again and runs
grants v9.

Revision ID: 0030
Revises: 0029
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DROP FUNCTION pepsi.dashboard_pause_stage(text, boolean)")
    install(op, "pause_stage", 1)
    run(op, "grants", 10)


def downgrade() -> None:
    op.execute("DROP FUNCTION pepsi.pause_stage(text, boolean)")
    install(op, "dashboard_pause_stage", 2)
    run(op, "grants", 9)
