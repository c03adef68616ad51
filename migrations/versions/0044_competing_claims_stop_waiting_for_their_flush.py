"""Competing claims stop waiting for their WAL flush

Why: a competing replica's claim committed synchronously, so that a server
crash could never undo a claim whose rows a worker already runs (another
replica would run them again). Under load that flush wait took 1.4-2.2 ms
of every claim, in the loop, and two replicas on one stage drained 0.70x of
one dispatcher. Claims now commit as a single dispatcher's do, and the
crash case is covered at the other end: a replica that connects (at start,
or after any reconnect) claims nothing until every other
registered replica has come back (its heartbeat retakes its liveness lock,
after it stopped the workers it had when the server restarted) or is older
than ORPHAN_TIMEOUT. replicas_away names the replicas it waits for.

* replicas_away v1 (new)
* grants v18 (was v17)

Revision ID: 0044
Revises: 0043
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0044"
down_revision = "0043"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install(op, "replicas_away", 1)
    run(op, "grants", 18)


def downgrade() -> None:
    op.execute("DROP FUNCTION pepsi.replicas_away")
    run(op, "grants", 17)
