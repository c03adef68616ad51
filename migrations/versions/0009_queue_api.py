"""Queue API round two: delays, retries, cancel, stage registry, operator views.

Delayed messages, object-only payloads, cancel, automatic retries, the stage
registry and the functions behind pepsi-queue show/status/failed:

- schema: pepsi.stages, the stage registry (migrations/sql/schema/stages.v1.sql);
- pause v3: refuses a non-finite `until` (22008): a pause that never ends is
  a failure in disguise (the stage should fail the message, or pause it for
  a long, finite time);
- requeue_due v3: rows paused until 'infinity' are never due and never make
  next_due infinite (`timeout < 'infinity'` keeps the ordered scan of
  workqueue_paused_idx); before, `next_due - statement_timestamp()` raised
  "cannot subtract infinite timestamps" in the pipeline that also claims,
  so no stage was served; delayed rows flip without a retry and never
  expire (EXPIRY bounds how long a message is retried, not how far ahead it
  is scheduled), their mark removed in the same UPDATE;
- enqueue v2 / enqueue_many v2: `not_before` (delayed messages, marked by
  state->>'delayed_until'), payloads must be JSON objects (helper
  _check_payload v1);
- requeue_failed v2: notifies 'workqueue' (v1 did not: only INSERT does, so
  requeued rows waited up to POLL_INTERVAL for a claim, 15 s measured);
- record_dispatch_error v3: automatic retries from the registry's retry_delay,
  read in the same statement as the write (the dispatcher passes only what
  happened); returns the changed rows instead of a count, so the dispatcher
  tells a retried failure (not counted as failed) from a final one;
- purge v2: dry_run (pepsi-queue purge --dry-run, and a confirmation showing
  the count); the 3-argument v1 is dropped, 3-argument calls resolve to v2;
- new: cancel, register_stages, registered_stages, message_story,
  failed_reasons, queue_overview, queue_dispatchers.

Functions whose signature or result type changes are dropped and created again,
so their grants are given again here.  Grants follow grants.v1.sql: stage
programs (pepsi_stage) and producers (pepsi_ingress) enqueue; the operator
functions go to pepsi_dispatcher, the role operators use.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

from alembic import op

from migrations.sqlfiles import install, run

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

ENQUEUE_V1 = "pepsi.enqueue(text, jsonb)"
ENQUEUE_V2 = "pepsi.enqueue(text, jsonb, timestamptz)"
ENQUEUE_MANY_V1 = "pepsi.enqueue_many(text, jsonb[])"
ENQUEUE_MANY_V2 = "pepsi.enqueue_many(text, jsonb[], timestamptz)"
RECORD_ERRORS = "pepsi.record_dispatch_error(bigint, bigint[], text[], text[])"
PURGE_V1 = "pepsi.purge(text[], text, interval)"
PURGE_V2 = "pepsi.purge(text[], text, interval, boolean)"

#: New functions: (file name, signature, roles).
NEW = [
    ("_check_payload", "pepsi._check_payload(jsonb, text)", ()),
    ("cancel", "pepsi.cancel(bigint[], text, boolean)", ("pepsi_dispatcher",)),
    (
        "register_stages",
        "pepsi.register_stages(bigint, text[], text[], integer[], interval[], interval[],"
        " integer[], integer[])",
        ("pepsi_dispatcher",),
    ),
    (
        "registered_stages",
        "pepsi.registered_stages()",
        ("pepsi_dispatcher", "pepsi_ingress", "pepsi_stage"),
    ),
    ("message_story", "pepsi.message_story(bigint)", ("pepsi_dispatcher",)),
    ("failed_reasons", "pepsi.failed_reasons(text)", ("pepsi_dispatcher",)),
    ("queue_overview", "pepsi.queue_overview()", ("pepsi_dispatcher",)),
    ("queue_dispatchers", "pepsi.queue_dispatchers()", ("pepsi_dispatcher",)),
]


def _grant(signature: str, *roles: str) -> None:
    op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
    if roles:
        op.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO {', '.join(roles)}")


def upgrade() -> None:
    run(op, "stages", 1)
    # Same signatures: CREATE OR REPLACE keeps the grants.
    install(op, "pause", 3)
    install(op, "requeue_due", 3)
    install(op, "requeue_failed", 2)
    for name, signature, roles in NEW:
        install(op, name, 1)
        _grant(signature, *roles)
    # New signatures (a third argument): the old ones would make 2-argument
    # calls ambiguous, so they go.
    op.execute(f"DROP FUNCTION {ENQUEUE_V1}")
    op.execute(f"DROP FUNCTION {ENQUEUE_MANY_V1}")
    install(op, "enqueue", 2)
    install(op, "enqueue_many", 2)
    _grant(ENQUEUE_V2, "pepsi_ingress", "pepsi_stage")
    _grant(ENQUEUE_MANY_V2, "pepsi_ingress", "pepsi_stage")
    op.execute(f"DROP FUNCTION {PURGE_V1}")
    install(op, "purge", 2)
    _grant(PURGE_V2, "pepsi_dispatcher")
    # New result type (rows instead of a count).
    op.execute(f"DROP FUNCTION {RECORD_ERRORS}")
    install(op, "record_dispatch_error", 3)
    _grant(RECORD_ERRORS, "pepsi_dispatcher")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {RECORD_ERRORS}")
    install(op, "record_dispatch_error", 2)
    _grant(RECORD_ERRORS, "pepsi_dispatcher")
    op.execute(f"DROP FUNCTION {PURGE_V2}")
    install(op, "purge", 1)
    _grant(PURGE_V1, "pepsi_dispatcher")
    op.execute(f"DROP FUNCTION {ENQUEUE_MANY_V2}")
    op.execute(f"DROP FUNCTION {ENQUEUE_V2}")
    install(op, "enqueue", 1)
    install(op, "enqueue_many", 1)
    _grant(ENQUEUE_V1, "pepsi_ingress", "pepsi_stage")
    _grant(ENQUEUE_MANY_V1, "pepsi_ingress", "pepsi_stage")
    for _name, signature, _roles in reversed(NEW):
        op.execute(f"DROP FUNCTION {signature}")
    install(op, "requeue_failed", 1)
    install(op, "requeue_due", 2)
    install(op, "pause", 2)
    # Delayed rows still waiting stay paused; requeue_due v2 flips them counting
    # a retry, as it does any paused row (their state keeps 'delayed_until').
    op.execute("DROP TABLE pepsi.stages")
