"""pepsi-httpd: the pepsi_dashboard role, dashboard_* functions, heartbeat v3.

* migrations/sql/schema/dashboard.v1.sql: role pepsi_dashboard (NOLOGIN, created when
  missing), USAGE on schema pepsi, column dispatchers.gauges (jsonb).
* heartbeat v3: an optional gauges jsonb argument (the dispatcher's in-memory
  gauges for /metrics).  A new signature, so v2's is dropped first; the
  one-argument call keeps working through the default.
* dashboard_snapshot, dashboard_failed, dashboard_message (read) and
  dashboard_requeue, dashboard_cancel, dashboard_pause_stage (the dashboard's
  buttons), all SECURITY DEFINER, EXECUTE granted to pepsi_dashboard only.

Downgrade drops all of it and installs heartbeat v2 again.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

DASHBOARD_FUNCTIONS = {
    "dashboard_snapshot": "pepsi.dashboard_snapshot(interval)",
    "dashboard_failed": "pepsi.dashboard_failed(text, text, integer)",
    "dashboard_message": "pepsi.dashboard_message(bigint)",
    "dashboard_requeue": "pepsi.dashboard_requeue(bigint[])",
    "dashboard_cancel": "pepsi.dashboard_cancel(bigint[])",
    "dashboard_pause_stage": "pepsi.dashboard_pause_stage(text, boolean)",
}
HEARTBEAT_V2 = "pepsi.heartbeat(bigint)"
HEARTBEAT_V3 = "pepsi.heartbeat(bigint, jsonb)"


def _grant(signature: str, role: str) -> None:
    op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO {role}")


def upgrade() -> None:
    run(op, "dashboard", 1)
    op.execute(f"DROP FUNCTION {HEARTBEAT_V2}")
    install(op, "heartbeat", 3)
    _grant(HEARTBEAT_V3, "pepsi_dispatcher")
    for name, signature in DASHBOARD_FUNCTIONS.items():
        install(op, name, 1)
        _grant(signature, "pepsi_dashboard")


def downgrade() -> None:
    run(op, "dashboard_drop", 1)
    op.execute(f"DROP FUNCTION {HEARTBEAT_V3}")
    install(op, "heartbeat", 2)
    _grant(HEARTBEAT_V2, "pepsi_dispatcher")
