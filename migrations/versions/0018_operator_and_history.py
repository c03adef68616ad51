"""The operator's day: pepsi_operator, message listing, failure groups, history.

* ``pepsi_operator`` (NOLOGIN): a role for people. It reads the queue,
  enqueues, lists, shows, requeues, cancels and purges; it cannot claim,
  release or move a running row. Before it, people used the dispatcher's
  role (and an operator with a producer's role could not enqueue a batch).
* ``pepsi.schema_version()``: the alembic revision, SECURITY DEFINER, so
  ``serve --check`` under the dispatcher's role (which may not read
  public.alembic_version) agrees with ``serve``.
* ``pepsi.list_messages``: any message, filtered, keyset-paged on indexes.
* failed_reasons v2 / failed_messages v2: failures grouped by
  ``pepsi._normalise_reason`` (0017, the dashboard's rule too), the raw
  reasons one call away.
* ``pepsi.attempts`` (+ ``pepsi.tracebacks``, ``note_traceback``,
  ``message_history``): a bounded history per message, written by a trigger
  that fires only on non-success endings, so the success path pays no write.
* message_story v2: a paused-then-resumed message no longer shows a stale
  pause_reason.

Grants: migrations/sql/schema/grants.v5.sql (grants.v4.sql plus the above).

Downgrade drops all of it and installs the previous versions: 0017's catalog.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

NEW_FUNCTIONS = (
    "pepsi.list_messages(text[], text, interval, jsonb, bigint, integer)",
    "pepsi.message_history(bigint)",
    "pepsi.note_traceback(bigint, text, text, bigint)",
    "pepsi.schema_version()",
)
# Dropped after the trigger and the tables (history_drop.v1.sql).
HELPERS = (
    "pepsi._record_attempt()",
    "pepsi._list_messages_sql(text[], text, interval, jsonb, bigint, integer)",
)


def upgrade() -> None:
    run(op, "history", 1)
    install(op, "_record_attempt", 1)
    run(op, "history_trigger", 1)
    install(op, "schema_version", 1)
    install(op, "note_traceback", 1)
    install(op, "_list_messages_sql", 1)
    install(op, "list_messages", 1)
    install(op, "message_history", 1)
    install(op, "message_story", 2)
    op.execute("DROP FUNCTION pepsi.failed_reasons(text)")
    install(op, "failed_reasons", 2)
    op.execute("DROP FUNCTION pepsi.failed_messages(text, integer)")
    install(op, "failed_messages", 2)
    run(op, "grants", 5)


def downgrade() -> None:
    op.execute("DROP FUNCTION pepsi.failed_messages(text, integer, text)")
    install(op, "failed_messages", 1)
    op.execute("DROP FUNCTION pepsi.failed_reasons(text)")
    install(op, "failed_reasons", 1)
    install(op, "message_story", 1)
    for signature in NEW_FUNCTIONS:
        op.execute(f"DROP FUNCTION {signature}")
    run(op, "history_drop", 2)  # v1 kept the role's grants when the role was kept
    for signature in HELPERS:
        op.execute(f"DROP FUNCTION {signature}")
    run(op, "grants", 4)
