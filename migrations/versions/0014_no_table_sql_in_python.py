"""The dispatcher reads no table: what db.py selected directly now has a function.

Issue 7: the SQL functions are the only surface; the Python side reads no
table of schema pepsi.  New functions, EXECUTE for pepsi_dispatcher only
(revoked from PUBLIC, as in grants.v1.sql):

* dispatcher_registered(dispatcher_id): is the registration still there
  (competing replicas, after a replica declared this one dead);
* held_ids(dispatcher_id): the running rows the database says a dispatcher
  holds (after a reconnect; workqueue_running_idx);
* stages_of(ids): the current stage of each id, by primary key.

The configuration overlay is read through stage_config (0003: the [stage-*]
rows, the only ones the dispatcher applies) and the "already served" message
through queue_dispatchers (0009).

Downgrade drops the three functions.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-30
"""

from alembic import op

from migrations.sqlfiles import install

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


def _grant(signature: str, role: str) -> None:
    op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO {role}")


def upgrade() -> None:
    for name, signature in NEW:
        install(op, name, 1)
        _grant(signature, "pepsi_dispatcher")


def downgrade() -> None:
    for _name, signature in reversed(NEW):
        op.execute(f"DROP FUNCTION {signature}")
