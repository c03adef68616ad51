"""The hot functions' plans hold however the table grows.

Since 0023 the hot functions are planned once per session (force_generic_plan),
from the statistics of their first call. A dispatcher or worker started on an
empty queue planned for an empty table -- sequential scans -- and kept those
plans while the backlog grew, until an ANALYZE of pepsi.workqueue invalidated
them (never, on a server with autovacuum off): 850 instead of ~150 us of
PostgreSQL CPU per message at the shipped stage defaults. Each of the five
functions now also sets enable_seqscan, enable_hashjoin and enable_mergejoin
off, so its plan is index scans and nested loops whatever the statistics say:

* claim v7, check_answered v5, get_messages v3, finish_many v3,
  advance_many v3: as before, plus those three settings.

Same signatures and results (CREATE OR REPLACE keeps the grants).

Downgrade installs claim v6, check_answered v4, get_messages v2,
finish_many v2 and advance_many v2 again.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-02
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

VERSIONS = {  # name: (head before, head after)
    "claim": (6, 7),
    "check_answered": (4, 5),
    "get_messages": (2, 3),
    "finish_many": (2, 3),
    "advance_many": (2, 3),
}


def upgrade() -> None:
    for name, (_, new) in VERSIONS.items():
        install(op, name, new)


def downgrade() -> None:
    for name, (old, _) in VERSIONS.items():
        install(op, name, old)
