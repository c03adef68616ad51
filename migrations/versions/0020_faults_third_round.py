"""Holes of the third round: reserved state keys, dashboard limits, liveness by session.

* set_state v3 refuses every state key the queue reserves
  (_reserved_state_keys v1: dispatch_error, delayed_until, retry_error,
  previous_error, cancelled_status, scheduled_for). v2 refused only dispatch_error, so a
  stage could write delayed_until, pause, and have requeue_due flip its
  message back without counting a retry and never expire it (seen: 25 runs
  in 25 s with MAX_RETRIES 2). Running rows
  that already carry the forged mark lose it (migrations/sql/schema/reserved_state.v1).
* dashboard_pause_stage v2 pauses only stages of the stage registry: a
  PAUSED row for an unknown stage made the graph stop parsing, the
  dispatcher exit 1, and every restart exit 2.
* dashboard_snapshot v5 returns only the overlay options the dashboard shows
  (never WORKER_DSN, DSN or a value carrying a credential: with a stage's
  WORKER_DSN a pepsi_dashboard login could act as pepsi_stage) and lists only
  dispatchers whose session is there.
* Liveness by session: register_dispatcher v2 and heartbeat v4 take a
  per-dispatcher session-level advisory lock (_dispatcher_hold v1);
  _dispatcher_live v1 reads it; queue_dispatchers v3, queue_overview v3,
  stage_health v2 and dashboard_snapshot v5 judge liveness by it, so a dispatcher killed with
  SIGKILL is neither counted nor exported once its connections are gone.
  reset_orphans v2: a single (non-competing) dispatcher removes every other
  registration at start (holding the lock exclusively proves them dead).

Same signatures and result types everywhere (CREATE OR REPLACE keeps the
grants); the new helpers are private: the grants file at head is run again,
which revokes EXECUTE from PUBLIC on every function it does not grant.

Downgrade installs the previous versions and drops the helpers.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-01
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

HELPERS = ("_reserved_state_keys", "_dispatcher_live", "_dispatcher_hold")
UPGRADED = {
    "set_state": 3,
    "dashboard_pause_stage": 2,
    "register_dispatcher": 2,
    "heartbeat": 4,
    "reset_orphans": 2,
    "queue_dispatchers": 3,
    "queue_overview": 3,
    "dashboard_snapshot": 5,
    "stage_health": 2,
}
PREVIOUS = {
    "set_state": 2,
    "dashboard_pause_stage": 1,
    "register_dispatcher": 1,
    "heartbeat": 3,
    "reset_orphans": 1,
    "queue_dispatchers": 2,
    "queue_overview": 2,
    "dashboard_snapshot": 4,
    "stage_health": 1,
}


def upgrade() -> None:
    for name in HELPERS:
        install(op, name, 1)
    for name, version in UPGRADED.items():
        install(op, name, version)
    run(op, "reserved_state", 1)
    run(op, "grants", 6)


def downgrade() -> None:
    for name, version in PREVIOUS.items():
        install(op, name, version)
    op.execute("DROP FUNCTION pepsi._dispatcher_hold(bigint)")
    op.execute("DROP FUNCTION pepsi._dispatcher_live(bigint)")
    op.execute("DROP FUNCTION pepsi._reserved_state_keys()")
    run(op, "grants", 6)
