"""Small tables stay small; the claim always skips locked rows and renders only what is asked.

Why: pepsi.dispatchers, rewritten by every heartbeat, grew for as long as
a dispatcher ran (8 -> 312 kB in a 60-minute endurance run): an update that
finds its page full while a snapshot protects the old versions extends the
file, and only VACUUM records the pages that empty later, but autovacuum
never came (page pruning keeps the dead-row count under its threshold of
50).  The tables that hold a row per stage, dispatcher or schedule and are
rewritten in place now have a threshold of 0 (small_tables_vacuum.v1.sql).

claim_lines v2: the pick always skips locked rows (the dispatcher asked for
that since 0027, and the second, waiting copy of the statement was dead);
skip_locked is accepted and changes nothing.  A row's line is rendered
only when its stage's line limit is above 0: v1 rendered the payload and
state of every claimed row whenever line_limits was not NULL, then
dropped the text of stages whose limit was 0 (the dispatcher sent NULL
limits to avoid that).

* claim_lines v2 (was v1)
* small_tables_vacuum v1 (autovacuum thresholds of five small tables)

Revision ID: 0038
Revises: 0037
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0038"
down_revision = "0037"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install(op, "claim_lines", 2)
    run(op, "small_tables_vacuum", 1)


def downgrade() -> None:
    run(op, "small_tables_vacuum_drop", 1)
    install(op, "claim_lines", 1)
