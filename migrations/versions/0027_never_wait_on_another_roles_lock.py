"""Never wait on another role's lock; requeue_failed never raises 23505.

Producers, operators and applications lock queue rows and keys too, so the
dispatcher may not wait on them:

* fire_schedule v2 (was v1): waits at most lock_timeout = 200 ms (set on the
  function) for the schedule's row or for a dedupe key a producer holds in an
  open transaction; past it, 55P03 and nothing written, and the dispatcher
  tries that schedule again a second later. v1 waited inside the dispatcher's
  only loop (27 s frozen in one trial) and every stage stopped meanwhile.
* requeue_failed v4 (was v3): the rows with a dedupe key move one at a time,
  each in a subtransaction that turns a unique violation into "not moved". v3
  checked the keys, then updated: a producer taking one of the keys in
  between (or holding it in an open transaction) made the whole requeue raise
  23505, and nothing was requeued.
* enqueue v4, enqueue_many v4 (were v3), and fire_schedule v2: a dedupe key
  of only whitespace is refused (22023), as an empty one was.

The claim needs no new revision: it already had skip_locked (FOR UPDATE
SKIP LOCKED in the pick), which the dispatcher now always passes.
Same signatures and results: grants kept.

Revision ID: 0027
Revises: 0026
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install(op, "enqueue", 4)
    install(op, "enqueue_many", 4)
    install(op, "fire_schedule", 2)
    install(op, "requeue_failed", 4)


def downgrade() -> None:
    install(op, "requeue_failed", 3)
    install(op, "fire_schedule", 1)
    install(op, "enqueue_many", 3)
    install(op, "enqueue", 3)
