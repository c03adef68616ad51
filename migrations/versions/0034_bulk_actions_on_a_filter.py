"""Bulk actions on a filter: requeue or cancel every message a list filter selects.

Why: an operator facing thousands of failed messages could requeue them by
stage only (pepsi-queue) or by a page of picked ids (the dashboard, at most
1000), never "the failed ones of stage X older than an hour whose payload
has customer 7". Doing it id by id from Python is thousands of calls. Now
one call acts on a whole filter, with the message list's own filter:

* _list_messages_where v1 (new, granted to nobody): list_messages' filter
  conditions, moved out of _list_messages_sql so the actions share them.
* _list_messages_sql v4: the same statement, its conditions from there.
* _matching_ids v1 (new, granted to nobody): the ids a filter selects among
  the statuses an action acts on, every page at once.
* requeue_matching v1, cancel_matching v1 (new): count (dry_run) or act
  through requeue_failed / cancel, so dedupe keys and the cancel rules hold;
  to pepsi_operator and pepsi_dashboard (grants v12).

* _list_messages_sql v4 (was v3)
* _list_messages_where v1 (new)
* _matching_ids v1 (new)
* cancel_matching v1 (new)
* requeue_matching v1 (new)
* grants v12 (was v11)

Revision ID: 0034
Revises: 0033
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install(op, "_list_messages_sql", 4)
    install(op, "_list_messages_where", 1)
    install(op, "_matching_ids", 1)
    install(op, "cancel_matching", 1)
    install(op, "requeue_matching", 1)
    run(op, "grants", 12)


def downgrade() -> None:
    op.execute("DROP FUNCTION pepsi.requeue_matching")
    op.execute("DROP FUNCTION pepsi.cancel_matching")
    op.execute("DROP FUNCTION pepsi._matching_ids")
    op.execute("DROP FUNCTION pepsi._list_messages_where")
    install(op, "_list_messages_sql", 3)
    run(op, "grants", 11)
