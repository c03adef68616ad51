"""Stage health, series at zero, a registry-drawn graph, the dashboard's message list.

* stage_health v1 (new): every stage's health as the live dispatchers report
  it with their heartbeat gauges (serving, held off with cause and since
  when, no worker able to start, paused); pepsi-queue status and
  pepsi-httpd read it.  EXECUTE for pepsi_dispatcher.
* _normalise_reason v1 (new): the group of a failure reason (numbers, ids,
  hex masked; the protocol's answer code dropped), one rule for every
  grouping of failures.  No role executes it directly.
* dashboard_messages v1 (new): the dashboard's list of messages of any
  status with filters, paged by id.  EXECUTE for pepsi_dashboard.
* dashboard_snapshot v4: queue depth and oldest age for every registered
  stage and every status, zeros included; the stage registry (the graph is
  drawn from it: pepsi-httpd needs only a DSN); stage_health; failure groups
  by normalised reason with the raw reasons.  Same signature.
* metrics v2: pepsi_queue_depth zeros included.  Same signature.

Grants: migrations/sql/schema/grants.v4.sql (grants.v3.sql plus the two new EXECUTEs),
run after the functions exist.

Downgrade installs dashboard_snapshot v3 and metrics v1, drops the three new
functions and runs grants.v3.sql again.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

#: New functions, in creation order: (file name, signature).
NEW = [
    ("_normalise_reason", "pepsi._normalise_reason(text)"),
    ("stage_health", "pepsi.stage_health()"),
    (
        "dashboard_messages",
        "pepsi.dashboard_messages(text, text, interval, jsonb, text, integer, bigint)",
    ),
]


def upgrade() -> None:
    for name, _signature in NEW:
        install(op, name, 1)
    install(op, "dashboard_snapshot", 4)
    install(op, "metrics", 2)
    run(op, "grants", 4)


def downgrade() -> None:
    install(op, "metrics", 1)
    install(op, "dashboard_snapshot", 3)
    for _name, signature in reversed(NEW):
        op.execute(f"DROP FUNCTION {signature}")
    run(op, "grants", 3)
