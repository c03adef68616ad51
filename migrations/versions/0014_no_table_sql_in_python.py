"""The dispatcher reads no table: what db.py selected directly now has a function.

Issue 7: the SQL functions are the only surface; the Python side reads no
table of schema pepsi.  New functions, EXECUTE for pepsi_dispatcher only
(sql/schema/grants.v2.sql):

* dispatcher_registered(dispatcher_id): is the registration still there
  (competing replicas, after a replica declared this one dead);
* held_ids(dispatcher_id): the running rows the database says a dispatcher
  holds (after a reconnect; workqueue_running_idx);
* stages_of(ids): the current stage of each id, by primary key.

The configuration overlay is read through stage_config (0003: the [stage-*]
rows, the only ones the dispatcher applies) and the "already served" message
through queue_dispatchers (0009).

Grants live in one versioned file from here on: grants.v2.sql is the complete
set at this revision (what grants.v1.sql and the GRANT/REVOKE statements of
0003..0012 had built, plus the new functions), run after the functions exist.
It takes every privilege from PUBLIC and the pepsi roles and grants them
again in the order the migrations did, so the ACLs of existing objects come
out as 0013 left them.

Downgrade drops the three functions; the grants of every other object are
then exactly 0013's (grants.v1.sql cannot be run: it names signatures that
0007..0010 replaced).

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


def upgrade() -> None:
    for name, _signature in NEW:
        install(op, name, 1)
    run(op, "grants", 2)


def downgrade() -> None:
    for _name, signature in reversed(NEW):
        op.execute(f"DROP FUNCTION {signature}")
