"""Rates that are rates: the statistics readers add what is not flushed yet.

Why: the dashboard's throughput chart, status --watch and the exported
pepsi_stage_*_total counters read pepsi.stage_stats, which the dispatcher
flushes every STATS_INTERVAL (60 s): a steady 13 msg/s drain drew as 0,
then one 112 msg/s spike, and Prometheus rate() over the counters was
wrong at the usual scrape windows. The dispatcher's gauges now carry its
unflushed deltas (sent within about a second of a change), a flush writes
the statistics and the gauges without the flushed deltas in one statement,
and the readers add the two:

* _live_stats v1 (new, granted to nobody): stage_stats plus the live
  dispatchers' unflushed deltas.
* dashboard_snapshot: stage_stats and totals through it.
* queue_overview: the *_total columns through it (status --watch).

* _live_stats v1 (new)
* dashboard_snapshot v7 (was v6)
* queue_overview v5 (was v4)

Revision ID: 0032
Revises: 0031
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install(op, "_live_stats", 1)
    install(op, "dashboard_snapshot", 7)
    install(op, "queue_overview", 5)
    run(op, "grants", 10)  # _live_stats is new: no EXECUTE for PUBLIC


def downgrade() -> None:
    install(op, "queue_overview", 4)
    install(op, "dashboard_snapshot", 6)
    op.execute("DROP FUNCTION pepsi._live_stats")
