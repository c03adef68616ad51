"""The claim's priority-0 band never walks the primary key.

claim v7's priority-0 band (`priority = 0 AND workqueue_id > floor`) has both
the stage and the priority as constants, so its order is workqueue_id alone,
which the primary key also gives. A session whose first claim came after an
ANALYZE taken while one stage held the backlog planned that band as a primary
key walk from the floor, filtering on stage: each claim of the other stages
read past every row of the busy one (200,000 pending rows in one stage: 6,214
buffers and 146,669 rows filtered, 90-160 ms per claim, against 12 buffers and
~2.5 ms now). A generic plan guesses a stage's share of the table as
1/(number of stages), so such statistics chose that walk for every stage.

* claim v8: the band is the range `priority >= 0 AND priority <= 0` (the same
  index range of workqueue_pending_idx, started at the floor), and the
  function sets enable_sort off (no primary key walk with a sort either) and
  jit off (the disabled sort of the final ORDER BY would make every call
  compile, ~300 ms by LLVM). Both bounds are inclusive, so the scan is
  positioned on the floor's id as before.

Same signature and result (CREATE OR REPLACE keeps the grants).

Downgrade installs claim v7 again.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-02
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

VERSIONS = {"claim": (7, 8)}  # name: (head before, head after)


def upgrade() -> None:
    for name, (_, new) in VERSIONS.items():
        install(op, name, new)


def downgrade() -> None:
    for name, (old, _) in VERSIONS.items():
        install(op, name, old)
