"""One message list, one metrics renderer: each fact has one source.

Why: two functions listed messages and had drifted. list_messages
(pepsi-queue list) filtered older_than on created_at and took 1 … 10,000
rows; dashboard_messages (pepsi-httpd's message page) filtered it on
updated_at, clamped at 1,000 and gave pause_reason as the reason of a row
no longer paused. Now both callers use list_messages v2: older_than means
last updated before (in its current status that long, as pepsi.purge's),
one cap of 10,000 rows (22023 outside it), and the dashboard's additions
in the one body: the kind column (delayed, retry wait, stage paused,
cancelled) and the reason_group filter (a failure group of
failed_reasons). The dashboard cuts the payload to its preview in its own
SELECT over the function's rows.

pepsi.metrics() rendered the Prometheus text a second time, with every
help text typed again, and no program called it: pepsi-httpd's /metrics
(written from dashboard_snapshot by pepsi_dispatch/httpd/exposition.py) is
the one renderer, and its pepsi_dispatchers had already come to mean
something else (live dispatchers, where metrics() counted registrations).

* _list_messages_sql v3 (was v2): new arguments reason_group and
  paused_stages, the kind column, older_than on updated_at (dropped first:
  the signature changes)
* list_messages v2 (was v1): new argument reason_group, result gains kind
  (dropped first)
* dashboard_messages: dropped (pepsi_dashboard calls list_messages)
* metrics: dropped (pepsi-httpd's /metrics)
* grants v9 (was v8): list_messages' new signature; no metrics, no
  dashboard_messages

Downgrade drops the new list functions, installs the previous revisions,
dashboard_messages v2 and metrics v3, and runs grants.v8.sql again.

Revision ID: 0029
Revises: 0028
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

OLD = {
    "list_messages": "pepsi.list_messages(text[], text, interval, jsonb, bigint, integer)",
    "_list_messages_sql": (
        "pepsi._list_messages_sql(text[], text, interval, jsonb, bigint, integer)"
    ),
}
NEW = {
    "list_messages": "pepsi.list_messages(text[], text, interval, jsonb, bigint, integer, text)",
    "_list_messages_sql": (
        "pepsi._list_messages_sql(text[], text, interval, jsonb, bigint, integer, text, text[])"
    ),
}
DROPPED = {
    "dashboard_messages": (
        "pepsi.dashboard_messages(text, text, interval, jsonb, text, integer, bigint)"
    ),
    "metrics": "pepsi.metrics()",
}


def upgrade() -> None:
    op.execute(f"DROP FUNCTION {DROPPED['dashboard_messages']}")
    op.execute(f"DROP FUNCTION {DROPPED['metrics']}")
    op.execute(f"DROP FUNCTION {OLD['list_messages']}")
    op.execute(f"DROP FUNCTION {OLD['_list_messages_sql']}")
    install(op, "_list_messages_sql", 3)
    install(op, "list_messages", 2)
    run(op, "grants", 9)


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {NEW['list_messages']}")
    op.execute(f"DROP FUNCTION {NEW['_list_messages_sql']}")
    install(op, "_list_messages_sql", 2)
    install(op, "list_messages", 1)
    install(op, "dashboard_messages", 2)
    install(op, "metrics", 3)
    run(op, "grants", 8)
