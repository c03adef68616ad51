"""pepsi.metrics() again: Prometheus text for any HTTP front end.

Why: the contract names ``pepsi.metrics() returns text`` (the stats and the
live queue depth by stage and status, for any HTTP front end), and 0029
dropped it because it rendered a second, drifting copy of pepsi-httpd's
families (other names, other help texts, registrations counted as
dispatchers).  v4 renders from one pepsi.dashboard_snapshot(), the call
pepsi-httpd's /metrics is built from, with pepsi-httpd's names and help
texts: the stage counters, the dispatch totals (pepsi_queue_*_total), the
queue depth and the retries due.  A test renders both from one database
state and asserts the families, help texts and samples are the same, so the
two cannot drift again.

* metrics v4 (v3 was dropped by 0029; new signature-compatible function)
* grants v14 (was v13): metrics() to pepsi_dispatcher, pepsi_operator and
  pepsi_dashboard

Downgrade drops the function and runs grants v13 again.

Revision ID: 0039
Revises: 0038
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0039"
down_revision = "0038"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install(op, "metrics", 4)
    run(op, "grants", 14)


def downgrade() -> None:
    op.execute("DROP FUNCTION pepsi.metrics()")
    run(op, "grants", 13)
