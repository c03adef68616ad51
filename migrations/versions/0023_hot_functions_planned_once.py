"""The hot functions are planned once per session, not at every call.

perf of a one-stage SDK drain at the shipped stage defaults (PARALLELISM 4 x
QUEUE_LIMIT 4) found about a third of PostgreSQL's CPU in the planner: the
PL/pgSQL functions that take arrays made a custom plan at every call (the plan
cache priced its generic plan higher), and the LANGUAGE sql ones parse and
plan their body at every call. Their plans do not depend on the arrays, so:

* claim v6, check_answered v4, get_messages v2: as before, plus
  plan_cache_mode = force_generic_plan;
* finish_many v2, advance_many v2: the same statement in PL/pgSQL, with the
  same setting (a LANGUAGE sql function that is not inlined -- SECURITY
  DEFINER and SET never are -- parses and plans its body at every call in
  PostgreSQL 15); advance_many checks the stage name first.

Same signatures and results (CREATE OR REPLACE keeps the grants).

Downgrade installs claim v5, check_answered v3, get_messages v1,
finish_many v1 and advance_many v1 again.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-01
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

VERSIONS = {  # name: (head before, head after)
    "claim": (5, 6),
    "check_answered": (3, 4),
    "get_messages": (1, 2),
    "finish_many": (1, 2),
    "advance_many": (1, 2),
}


def upgrade() -> None:
    for name, (_, new) in VERSIONS.items():
        install(op, name, new)


def downgrade() -> None:
    for name, (old, _) in VERSIONS.items():
        install(op, name, old)
