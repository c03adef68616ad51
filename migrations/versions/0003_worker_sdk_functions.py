"""Functions for the worker SDK and the operator CLI: hop, stage_config,
failed_messages, purge.

- pepsi.hop: stage fusion (a worker moves its running row to the fused
  successor, still running; the pass ends with a transition from there).
- pepsi.stage_config: the [stage-*] overlay rows, readable by stage programs
  so the SDK checks advances against the dispatcher's graph.
- pepsi.failed_messages / pepsi.purge: pepsi-queue failed / purge.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from alembic import op

from migrations.sqlfiles import install

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

FUNCTIONS = ["hop", "stage_config", "failed_messages", "purge"]


def upgrade() -> None:
    for name in FUNCTIONS:
        install(op, name, 1)
    op.execute(
        """
        REVOKE ALL ON FUNCTION pepsi.hop(bigint, text, text, bigint),
                               pepsi.stage_config(),
                               pepsi.failed_messages(text, integer),
                               pepsi.purge(text[], text, interval) FROM PUBLIC;
        GRANT EXECUTE ON FUNCTION pepsi.hop(bigint, text, text, bigint) TO pepsi_stage;
        GRANT EXECUTE ON FUNCTION pepsi.stage_config() TO pepsi_stage, pepsi_dispatcher;
        GRANT EXECUTE ON FUNCTION pepsi.failed_messages(text, integer),
                                  pepsi.purge(text[], text, interval) TO pepsi_dispatcher;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP FUNCTION IF EXISTS pepsi.purge(text[], text, interval);
        DROP FUNCTION IF EXISTS pepsi.failed_messages(text, integer);
        DROP FUNCTION IF EXISTS pepsi.stage_config();
        DROP FUNCTION IF EXISTS pepsi.hop(bigint, text, text, bigint);
        """
    )
