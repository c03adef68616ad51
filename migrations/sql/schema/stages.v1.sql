-- Schema addition of migration 0009: the stage registry.
--
-- pepsi.stages: the stage table of the running configuration (file plus
-- overlay), written by pepsi.register_stages when a dispatcher starts and
-- after every reload.  Ingress tools check stage names against it (pepsi-queue
-- enqueue), record_dispatch_error reads the retry policy of a row's stage
-- from it, and operators see what the dispatcher routes by.  A set, replaced
-- as a whole: a stage a reload removed is deleted.  Competing replicas share
-- it (same configuration; the last one to register wins).
--
-- No CHECK constraint on payloads being objects: a CHECK binds every UPDATE
-- of a row too, so one non-object payload enqueued before 0009 would make the
-- claim that picks it fail -- for every stage.  enqueue and enqueue_many
-- refuse non-objects instead.

CREATE TABLE pepsi.stages (
    stage           text        PRIMARY KEY
                    CONSTRAINT stages_stage_name CHECK (stage ~ '^[A-Za-z0-9_.-]+$'),
    next            text[]      NOT NULL DEFAULT '{}',
    max_retries     integer     NOT NULL DEFAULT 10 CONSTRAINT stages_max_retries CHECK (max_retries >= 0),
    retry_delay     interval    CONSTRAINT stages_retry_delay CHECK (retry_delay > interval '0'),
    retry_delay_max interval    CONSTRAINT stages_retry_delay_max CHECK (retry_delay_max > interval '0'),
    parallelism     integer,
    queue_limit     integer,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    dispatcher_id   bigint
);
COMMENT ON TABLE pepsi.stages IS
    'stage table of the running configuration, written by pepsi.register_stages';

GRANT SELECT ON pepsi.stages TO pepsi_dispatcher;
