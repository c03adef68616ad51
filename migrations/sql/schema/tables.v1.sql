-- Schema pepsi, version 1: tables, constraints, indexes.
-- Triggers are in triggers.v1.sql (they need the trigger functions first),
-- grants in grants.v1.sql.

CREATE SCHEMA pepsi;
COMMENT ON SCHEMA pepsi IS 'pepsi-dispatch work queue (tables are private; use the functions)';

-- One row per running dispatcher.  Competing replicas heartbeat here; a row
-- whose heartbeat_at is older than ORPHAN_TIMEOUT belongs to a dead replica.
CREATE TABLE pepsi.dispatchers (
    dispatcher_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    hostname      text        NOT NULL,
    pid           integer     NOT NULL,
    competing     boolean     NOT NULL DEFAULT false,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per message.  workqueue.dispatcher_id deliberately has no foreign
-- key to dispatchers: the claim would pay one RI lookup per claimed row, and
-- reset_orphans must be able to delete a dead dispatcher before its rows.
CREATE TABLE pepsi.workqueue (
    workqueue_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stage         text        NOT NULL,
    status        text        NOT NULL DEFAULT 'pending',
    payload       jsonb       NOT NULL DEFAULT '{}',
    state         jsonb       NOT NULL DEFAULT '{}',
    timeout       timestamptz,
    retries       integer     NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    dispatcher_id bigint,
    CONSTRAINT workqueue_stage_name CHECK (stage ~ '^[A-Za-z0-9_.-]+$'),
    CONSTRAINT workqueue_status_known CHECK (status IN
        ('pending', 'running', 'paused', 'done', 'failed', 'timeout', 'expired')),
    CONSTRAINT workqueue_running_iff_dispatcher CHECK
        ((status = 'running') = (dispatcher_id IS NOT NULL)),
    CONSTRAINT workqueue_paused_has_timeout CHECK
        (status <> 'paused' OR timeout IS NOT NULL),
    CONSTRAINT workqueue_retries_not_negative CHECK (retries >= 0)
) WITH (
    -- Every claim and every transition leaves a dead entry in the partial
    -- pending index (and the row versions behind it).  Default autovacuum
    -- (20% of the table) would let a 1M-row table collect 200k of them before
    -- a vacuum; vacuum after ~1% instead.
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);

-- The claim: per stage, lowest pending ids first.
CREATE INDEX workqueue_pending_idx ON pepsi.workqueue (stage, workqueue_id)
    WHERE status = 'pending';
-- requeue_due and its next_due: earliest paused timeout.
CREATE INDEX workqueue_paused_idx ON pepsi.workqueue (timeout)
    WHERE status = 'paused';
-- release / reset_orphans / record_dispatch_error: running rows of a dispatcher.
CREATE INDEX workqueue_running_idx ON pepsi.workqueue (dispatcher_id)
    WHERE status = 'running';
-- purge_done: oldest done rows first.
CREATE INDEX workqueue_done_idx ON pepsi.workqueue (updated_at)
    WHERE status = 'done';
-- requeue_failed and the operator's view of what went wrong.
CREATE INDEX workqueue_failed_idx ON pepsi.workqueue (stage, workqueue_id)
    WHERE status IN ('failed', 'timeout', 'expired');

-- Per-stage totals; written only by the dispatcher, by delta (flush_stats).
CREATE TABLE pepsi.stage_stats (
    stage              text             PRIMARY KEY
                       CONSTRAINT stage_stats_stage_name CHECK (stage ~ '^[A-Za-z0-9_.-]+$'),
    processed          bigint           NOT NULL DEFAULT 0,
    failed             bigint           NOT NULL DEFAULT 0,
    timeouts           bigint           NOT NULL DEFAULT 0,
    crashes            bigint           NOT NULL DEFAULT 0,
    processing_seconds double precision NOT NULL DEFAULT 0,
    updated_at         timestamptz      NOT NULL DEFAULT now()
);

-- Global totals: exactly one row (id is always true).
CREATE TABLE pepsi.dispatch_stats (
    id         boolean     PRIMARY KEY DEFAULT true CONSTRAINT dispatch_stats_one_row CHECK (id),
    stage_runs bigint      NOT NULL DEFAULT 0,   -- stage executions, fused ones included
    messages   bigint      NOT NULL DEFAULT 0,   -- ids handed to workers
    failed     bigint      NOT NULL DEFAULT 0,
    timeouts   bigint      NOT NULL DEFAULT 0,
    crashes    bigint      NOT NULL DEFAULT 0,
    requeued   bigint      NOT NULL DEFAULT 0,   -- paused -> pending flips
    expired    bigint      NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO pepsi.dispatch_stats DEFAULT VALUES;

-- Database overlay of the [stage-*] options of pepsi.conf.
CREATE TABLE pepsi.config (
    section text NOT NULL,
    option  text NOT NULL,
    value   text NOT NULL,
    PRIMARY KEY (section, option)
);
