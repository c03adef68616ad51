"""Workers start only messages whose rows are still their dispatcher's.

Why: the dispatcher id fenced a worker's writes, not its starts. A competing
replica frozen longer than ORPHAN_TIMEOUT had its rows reset and run by
another; on resume its worker read the next id on its pipe and ran the
handler again before its dispatcher learnt it was declared dead and killed
it. The write was refused, but a side effect outside the database (a mail,
an HTTP call) happened twice. pin_messages loads a batch's rows and locks,
for the worker's transaction, those still running under its dispatcher: the
SDK starts only those, and no replica can reset them before it commits.
reset_orphans skips such locked rows (they are reset on a later heartbeat)
instead of waiting lock_timeout and failing the whole reset.

* pin_messages v1 (new; granted to pepsi_stage by grants v11)
* reset_orphans v3 (was v2): competing, SKIP LOCKED; same signature
* grants v11 (was v10)

Downgrade installs reset_orphans v2, drops pin_messages and runs grants v10.

Revision ID: 0033
Revises: 0032
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install(op, "pin_messages", 1)
    install(op, "reset_orphans", 3)
    run(op, "grants", 11)


def downgrade() -> None:
    install(op, "reset_orphans", 2)
    op.execute("DROP FUNCTION pepsi.pin_messages(bigint[], bigint)")
    run(op, "grants", 10)
