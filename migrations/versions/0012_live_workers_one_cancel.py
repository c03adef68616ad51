"""Live workers in queue_overview; the dashboard's buttons delegate to the queue API.

* queue_overview v2: per stage, the live dispatchers that run it and their
  worker processes by state (busy, idle, retiring, stopping), summed from
  pepsi.dispatchers.gauges (heartbeat v3, migration 0010).  pepsi-queue
  status --watch shows them instead of PARALLELISM x QUEUE_LIMIT.  The result
  type changes, so v1 is dropped and v2 granted again (pepsi_dispatcher).
* dashboard_cancel v2: pepsi.cancel(ids) instead of its own copy of the
  UPDATE (the copies had drifted: v1 kept 'delayed_until' and did not record
  'cancelled_status').
* dashboard_requeue v2: no NOTIFY of its own; requeue_failed v2 (0009)
  notifies.  (PostgreSQL folded the identical second notification into the
  first, so nothing changes on the wire: the rule lives in one place.)
Both dashboard functions keep their signatures, so CREATE OR REPLACE keeps
their grants (pepsi_dashboard only).

Downgrade installs queue_overview v1 (dropped and granted again),
dashboard_cancel v1 and dashboard_requeue v1.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-30
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

QUEUE_OVERVIEW = "pepsi.queue_overview()"


def _grant(signature: str, role: str) -> None:
    op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO {role}")


def upgrade() -> None:
    # New result columns: CREATE OR REPLACE cannot change a result type.
    op.execute(f"DROP FUNCTION {QUEUE_OVERVIEW}")
    install(op, "queue_overview", 2)
    _grant(QUEUE_OVERVIEW, "pepsi_dispatcher")
    # Same signatures: CREATE OR REPLACE keeps the grants.
    install(op, "dashboard_cancel", 2)
    install(op, "dashboard_requeue", 2)


def downgrade() -> None:
    install(op, "dashboard_requeue", 1)
    install(op, "dashboard_cancel", 1)
    op.execute(f"DROP FUNCTION {QUEUE_OVERVIEW}")
    install(op, "queue_overview", 1)
    _grant(QUEUE_OVERVIEW, "pepsi_dispatcher")
