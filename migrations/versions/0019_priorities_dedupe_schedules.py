"""Priorities, dedupe keys, schedules and reschedule.

What users of the other PostgreSQL queues expect (graphile-worker's priority,
job_key, crontab with known_crontabs, reschedule_jobs; River's priorities,
unique jobs, periodic jobs; procrastinate's priority, queueing_lock, periodic
tasks; PgQueuer's priority, dedupe_key, schedules):

- schema (migrations/sql/schema/queue_options.v1.sql): workqueue.priority (int not null
  default 0) and workqueue.dedupe_key (text); the claim index becomes
  (stage, priority DESC, workqueue_id) WHERE pending; a unique partial index
  on dedupe_key over pending, running and paused rows; table schedule_ticks.
- claim v5: highest priority first, by three band range scans so the claim
  floor still starts the priority-0 scan (one range scan ordered by
  priority could not start at a floor, an id: the index's third column);
  with every priority 0 the plan is v4's plus an empty descent into the
  positive band. Its result gains `priority` (signature changes: v4
  dropped, grants again).
- enqueue v3 / enqueue_many v3: priority and dedupe_key(s), named; the
  3-argument v2 of each is dropped (2- and 3-argument calls resolve to v3;
  both together would make them ambiguous). Without a key the INSERT has no
  ON CONFLICT clause, so keyless producers pay nothing.
- requeue_failed v3: never requeues a key a live message holds (v2 would
  have raised a unique violation on workqueue_dedupe_idx and failed the
  whole requeue).
- new: reschedule, dashboard_reschedule, register_schedules, fire_schedule,
  schedules, dashboard_schedules.
- grants.v6.sql: the complete set with the new signatures.

Downgrade drops the new functions, installs claim v4, enqueue v2,
enqueue_many v2, requeue_failed v2 again, undoes the schema (priorities and
keys of existing rows are lost) and runs grants.v5.sql.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-01
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

CLAIM_V4 = "pepsi.claim(bigint, text[], integer[], boolean, bigint[])"
ENQUEUE_V2 = "pepsi.enqueue(text, jsonb, timestamptz)"
ENQUEUE_V3 = "pepsi.enqueue(text, jsonb, timestamptz, integer, text)"
ENQUEUE_MANY_V2 = "pepsi.enqueue_many(text, jsonb[], timestamptz)"
ENQUEUE_MANY_V3 = "pepsi.enqueue_many(text, jsonb[], timestamptz, integer, text[])"
#: Dropped by the downgrade in this order (dashboard_schedules calls schedules).
NEW_FUNCTIONS = [
    "pepsi.dashboard_schedules()",
    "pepsi.schedules()",
    "pepsi.fire_schedule(text, timestamptz[], text, jsonb, integer, text, timestamptz)",
    "pepsi.register_schedules(text[], text[], text[], timestamptz[])",
    "pepsi.dashboard_reschedule(bigint, timestamptz)",
    "pepsi.reschedule(bigint, timestamptz)",
]


def upgrade() -> None:
    run(op, "queue_options", 1)
    op.execute(f"DROP FUNCTION {CLAIM_V4}")
    install(op, "claim", 5)
    op.execute(f"DROP FUNCTION {ENQUEUE_V2}")
    op.execute(f"DROP FUNCTION {ENQUEUE_MANY_V2}")
    install(op, "enqueue", 3)
    install(op, "enqueue_many", 3)
    install(op, "requeue_failed", 3)
    install(op, "reschedule", 1)
    install(op, "dashboard_reschedule", 1)
    install(op, "register_schedules", 1)
    install(op, "fire_schedule", 1)
    install(op, "schedules", 1)
    install(op, "dashboard_schedules", 1)  # after schedules, which it calls
    run(op, "grants", 6)


def downgrade() -> None:
    for signature in NEW_FUNCTIONS:
        op.execute(f"DROP FUNCTION {signature}")
    op.execute(f"DROP FUNCTION {ENQUEUE_MANY_V3}")
    op.execute(f"DROP FUNCTION {ENQUEUE_V3}")
    install(op, "enqueue", 2)
    install(op, "enqueue_many", 2)
    install(op, "requeue_failed", 2)
    op.execute(f"DROP FUNCTION {CLAIM_V4}")  # v5: same arguments
    install(op, "claim", 4)
    run(op, "queue_options_drop", 1)
    run(op, "grants", 5)
