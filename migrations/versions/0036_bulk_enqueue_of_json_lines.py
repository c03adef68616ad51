"""Bulk enqueue of JSON lines: pepsi.enqueue_lines

Why: 100,000 JSON lines through `pepsi-queue enqueue STAGE -` took 3.1 s
against 0.5 s for a bare COPY of the same rows on a 2-vCPU VM: Python parsed
every line, serialised it again, and sent a jsonb[] literal that the server
parsed a second time, in chunks of 5,000. enqueue_lines takes the JSON texts
as a binary text[] and parses, checks and inserts them in one set-based
statement (with keys: one look-up of the holders and one plain INSERT),
naming the first bad line by its number; pepsi-queue and enqueue_many send
through it. enqueue_many (SQL) stays as it was.

* _bad_line v1 (new)
* enqueue_lines v1 (new)
* grants v13 (was v12)

Revision ID: 0036
Revises: 0035
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install(op, "_bad_line", 1)
    install(op, "enqueue_lines", 1)
    run(op, "grants", 13)


def downgrade() -> None:
    op.execute("DROP FUNCTION pepsi.enqueue_lines")
    op.execute("DROP FUNCTION pepsi._bad_line")
    run(op, "grants", 12)
