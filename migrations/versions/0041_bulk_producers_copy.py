"""Bulk producers COPY into the queue: enqueue at the speed of COPY

Why: 100,000 messages through enqueue_many or `pepsi-queue enqueue STAGE -`
took about twice a bare COPY of the same rows: an INSERT ... SELECT writes a
WAL record per heap row where COPY writes a page at a time, and the function
parsed and checked each line on the way. Producers may now COPY the three
columns an enqueue sets (stage, payload, priority) themselves; every other
column takes its default, and the table refuses what pepsi.enqueue refuses
(the stage name was checked already; the insert trigger now refuses a
producer's payload that is not a JSON object). copy_mark and copied_ids
give the producer the ids its COPY drew.
pepsi_dispatch.enqueue takes this path when it owns the transaction and the
call has no keys and no delay, and falls back to enqueue_lines otherwise.

* copied_ids v1 (new)
* copy_mark v1 (new)
* _notify_workqueue v2: also refuses a producer's non-object payload
* payload_object v1 (schema: the insert trigger gets its new rows)
* grants v16 (was v15): copy_mark, copied_ids and INSERT (stage, payload,
  priority) on pepsi.workqueue to pepsi_ingress, pepsi_stage, pepsi_operator

Revision ID: 0041
Revises: 0040
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0041"
down_revision = "0040"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install(op, "copied_ids", 1)
    install(op, "copy_mark", 1)
    install(op, "_notify_workqueue", 2)
    run(op, "payload_object", 1)
    run(op, "grants", 16)


def downgrade() -> None:
    run(op, "grants", 15)
    install(op, "_notify_workqueue", 1)
    run(op, "payload_object_drop", 1)
    op.execute("DROP FUNCTION pepsi.copy_mark")
    op.execute("DROP FUNCTION pepsi.copied_ids")
