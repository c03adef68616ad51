"""Transitions v2: find the row by primary key, never by the running index.

advance, finish, fail, pause, hop, set_state, check_answered and
record_dispatch_error re-checked `status = 'running'`, which proves the
partial index workqueue_running_idx's predicate; with statistics taken while
few rows ran, the cached plan walked that whole index filtering by id (up to
8 ms per call under load, with a few thousand rows running: the workers'
transitions took more time than everything else in a 1-stage bench).  v2
writes the re-check as `(status = 'running') IS TRUE`: the same test (status
is NOT NULL) that proves nothing about the index, so the row is found by
workqueue_pkey.  See the headers of the v2 files.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

FUNCTIONS = (
    "advance",
    "finish",
    "fail",
    "pause",
    "hop",
    "set_state",
    "check_answered",
    "record_dispatch_error",
)


def upgrade() -> None:
    # Same signatures: CREATE OR REPLACE keeps the grants.
    for name in FUNCTIONS:
        install(op, name, 2)


def downgrade() -> None:
    for name in FUNCTIONS:
        install(op, name, 1)
