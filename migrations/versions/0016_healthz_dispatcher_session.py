"""dashboard_snapshot v3: whether a dispatcher session holds the database.

pepsi-httpd's /healthz went by the dispatcher's heartbeat alone, so it kept
answering 200 for up to 3 heartbeat intervals (90 s at POLL_INTERVAL 30 s)
after the dispatcher was killed with SIGKILL. v3 adds `dispatcher_session`:
true while some session of this database holds the dispatcher's advisory
lock, which a killed dispatcher loses with its connections. /healthz wants
both a live heartbeat and the session.

Same signature and result type: CREATE OR REPLACE keeps its grants, so the
grants file does not change.

Downgrade installs v2 again.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-30
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install(op, "dashboard_snapshot", 3)


def downgrade() -> None:
    install(op, "dashboard_snapshot", 2)
