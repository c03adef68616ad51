"""Kept failed rows move to pepsi.dead_letters: the hot table stays compact.

Failed, timeout and expired rows are kept until an operator acts. Kept in
pepsi.workqueue, each pinned the leaf page of workqueue_pkey (and of the other
indexes) holding its id, so VACUUM could never free pages whose other rows
were done and purged: in a 13-minute run at 150 msg/s with 3% failures the
primary key grew 744 -> 2,608 kB while the table stayed flat, a page per ~360
ids ever issued, for ever.

* schema dead_letters v1: table pepsi.dead_letters (the kept rows, same
  columns and ids, plus kept_at), view pepsi.messages (workqueue UNION ALL
  dead_letters), and attempts/tracebacks lose their foreign keys to workqueue
  (a moved row keeps its history; purges delete it explicitly).
* keep_dead_letters v1 (new): moves kept rows out, SKIP LOCKED, in batches;
  the dispatcher calls it on every heartbeat.
* Every function that reads terminal rows reads pepsi.messages (get_message,
  list, show, history, failed, the dashboard, metrics, counts);
  requeue_failed brings rows back with their ids; purge deletes from both
  tables; purge and purge_done delete the purged rows' history.
* grants v8: keep_dead_letters for pepsi_dispatcher; SELECT on dead_letters
  and messages for pepsi_operator.

* _list_messages_sql v2 (was v1)
* dashboard_failed v2 (was v1)
* dashboard_message v2 (was v1)
* dashboard_messages v2 (was v1)
* dashboard_snapshot v6 (was v5)
* failed_messages v3 (was v2)
* failed_reasons v3 (was v2)
* get_message v2 (was v1)
* keep_dead_letters v1 (new)
* message_history v2 (was v1)
* message_story v4 (was v3)
* metrics v3 (was v2)
* purge v3 (was v2)
* purge_done v2 (was v1)
* queue_counts v2 (was v1)
* queue_overview v4 (was v3)
* requeue_failed v5 (was v4)
* grants v8 (was v7)

Revision ID: 0028
Revises: 0027
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run(op, "dead_letters", 1)
    install(op, "_list_messages_sql", 2)
    install(op, "dashboard_failed", 2)
    install(op, "dashboard_message", 2)
    install(op, "dashboard_messages", 2)
    install(op, "dashboard_snapshot", 6)
    install(op, "failed_messages", 3)
    install(op, "failed_reasons", 3)
    install(op, "get_message", 2)
    install(op, "keep_dead_letters", 1)
    install(op, "message_history", 2)
    install(op, "message_story", 4)
    install(op, "metrics", 3)
    install(op, "purge", 3)
    install(op, "purge_done", 2)
    install(op, "queue_counts", 2)
    install(op, "queue_overview", 4)
    install(op, "requeue_failed", 5)
    run(op, "grants", 8)


def downgrade() -> None:
    install(op, "requeue_failed", 4)
    install(op, "queue_overview", 3)
    install(op, "queue_counts", 1)
    install(op, "purge_done", 1)
    install(op, "purge", 2)
    install(op, "metrics", 2)
    install(op, "message_story", 3)
    install(op, "message_history", 1)
    op.execute("DROP FUNCTION pepsi.keep_dead_letters")
    install(op, "get_message", 1)
    install(op, "failed_reasons", 2)
    install(op, "failed_messages", 2)
    install(op, "dashboard_snapshot", 5)
    install(op, "dashboard_messages", 1)
    install(op, "dashboard_message", 1)
    install(op, "dashboard_failed", 1)
    install(op, "_list_messages_sql", 1)
    run(op, "dead_letters_drop", 1)  # the kept rows back into workqueue
    run(op, "grants", 7)
