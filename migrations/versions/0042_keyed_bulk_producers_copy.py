"""Keyed bulk producers COPY too: dedupe keys at the speed of COPY

Why: 100,000 keyed messages through enqueue_many took about twice a bare
COPY of the same rows with their keys, since a call with dedupe keys still
went through enqueue_lines (an INSERT ... SELECT of an unnested array, its
ids sent back). Producers may now insert dedupe_key as well: the producer
looks up which keys live messages hold (key_holders), COPYs the rest with
their keys, and the unique index refuses a key a concurrent producer took
meanwhile (23505: pepsi_dispatch.enqueue then sends that chunk through
enqueue_lines, which answers with the holder's id). The insert trigger
refuses a producer's key that pepsi.enqueue would refuse.

* _notify_workqueue v3 (was v2): also refuses a producer's malformed key
* key_holders v1 (new)
* grants v17 (was v16): key_holders, and INSERT on dedupe_key, to
  pepsi_ingress, pepsi_stage, pepsi_operator

Revision ID: 0042
Revises: 0041
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0042"
down_revision = "0041"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install(op, "_notify_workqueue", 3)
    install(op, "key_holders", 1)
    run(op, "grants", 17)


def downgrade() -> None:
    run(op, "grants", 16)
    install(op, "_notify_workqueue", 2)
    op.execute("DROP FUNCTION pepsi.key_holders")
