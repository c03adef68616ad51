"""The dispatcher reads no table; grants in one file; one dispatcher liveness rule.

The SQL functions are the only surface; the Python side reads no
table of schema pepsi.  New functions, EXECUTE for pepsi_dispatcher only
(migrations/sql/schema/grants.v2.sql):

* dispatcher_registered(dispatcher_id): is the registration still there
  (competing replicas, after a replica declared this one dead);
* held_ids(dispatcher_id): the running rows the database says a dispatcher
  holds (after a reconnect; workqueue_running_idx);
* stages_of(ids): the current stage of each id, by primary key.

The configuration overlay is read through stage_config (0003: the [stage-*]
rows, the only ones the dispatcher applies) and the "already served" message
through queue_dispatchers.

One liveness rule for dispatchers (queue_overview v2's, 0012): live while the
heartbeat is no older than 3 x the heartbeat_interval of its gauges, else than
a fallback (5 minutes), at least 10 s:

* dashboard_snapshot v2: v1's fallback to live_within was dead (greatest()
  ignores NULL), so a dispatcher without an interval in its gauges was not
  live after 10 s.  Same signature: CREATE OR REPLACE keeps the grants.
* queue_dispatchers v2: a live column, so pepsi-queue status --watch stops
  using a fixed 120 s.  A new result column: v1 is dropped, v2 created.

Grants live in one versioned file from here on: grants.v2.sql is the complete
set at this revision (what grants.v1.sql and the GRANT/REVOKE statements of
0003..0012 had built, plus the new functions), run after the functions exist.
It takes every privilege from PUBLIC and the pepsi roles and grants them
again in the order the migrations did, so the ACLs of existing objects come
out as 0013 left them.

Downgrade installs dashboard_snapshot v1 and queue_dispatchers v1 (dropped
and created again, then granted by grants.v2.sql while every function it
names still exists) and drops the three new functions; the grants of every
other object are then exactly 0013's (grants.v1.sql cannot be run: it names
signatures that 0007..0010 replaced).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-30
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

#: New functions: (file name, signature).
NEW = [
    ("dispatcher_registered", "pepsi.dispatcher_registered(bigint)"),
    ("held_ids", "pepsi.held_ids(bigint)"),
    ("stages_of", "pepsi.stages_of(bigint[])"),
]


QUEUE_DISPATCHERS = "pepsi.queue_dispatchers()"


def upgrade() -> None:
    for name, _signature in NEW:
        install(op, name, 1)
    # Same signature and result type: CREATE OR REPLACE.
    install(op, "dashboard_snapshot", 2)
    # A new result column: CREATE OR REPLACE cannot change a result type.
    op.execute(f"DROP FUNCTION {QUEUE_DISPATCHERS}")
    install(op, "queue_dispatchers", 2)
    run(op, "grants", 2)


def downgrade() -> None:
    install(op, "dashboard_snapshot", 1)
    op.execute(f"DROP FUNCTION {QUEUE_DISPATCHERS}")
    install(op, "queue_dispatchers", 1)
    run(op, "grants", 2)  # grants queue_dispatchers v1 again, changes nothing else
    for _name, signature in reversed(NEW):
        op.execute(f"DROP FUNCTION {signature}")
