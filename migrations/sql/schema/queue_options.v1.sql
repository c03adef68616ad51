-- Priorities, dedupe keys and schedules (migration 0019).
--
-- workqueue.priority: higher is claimed first within a stage; equal
-- priorities in id (enqueue) order; default 0, negative allowed.  An advance
-- or a hop keeps it (no function writes it after the insert).  Adding a NOT
-- NULL column with a constant default does not rewrite the table.
--
-- workqueue.dedupe_key: NULL (no key) for almost every row.  While a row with
-- a key is pending, running or paused, no other row may carry the same key
-- (workqueue_dedupe_idx, UNIQUE and partial); once the row is terminal the
-- key is free.  Rows without a key are not in that index, so producers that
-- use no keys pay nothing for it.
--
-- workqueue_pending_idx becomes (stage, priority DESC, workqueue_id): the
-- claim's order.  Its predicate stays `status = 'pending'`.
--
-- schedule_ticks: one row per [schedule-NAME] a dispatcher has registered.
-- fire_schedule records a tick here in the same transaction as the message
-- it enqueues, under the row's lock, so competing replicas firing the same
-- tick enqueue it once (graphile-worker's known_crontabs does the same).
ALTER TABLE pepsi.workqueue
    ADD COLUMN priority   integer NOT NULL DEFAULT 0,
    ADD COLUMN dedupe_key text;

DROP INDEX pepsi.workqueue_pending_idx;
CREATE INDEX workqueue_pending_idx ON pepsi.workqueue (stage, priority DESC, workqueue_id)
    WHERE status = 'pending';

-- A key is taken while its row is not terminal.  enqueue's
-- INSERT ... ON CONFLICT (dedupe_key) WHERE <this predicate> DO NOTHING
-- names this index as its arbiter.
CREATE UNIQUE INDEX workqueue_dedupe_idx ON pepsi.workqueue (dedupe_key)
    WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'running', 'paused');

CREATE TABLE pepsi.schedule_ticks (
    name            text        PRIMARY KEY
                    CONSTRAINT schedule_ticks_name CHECK (name ~ '^[A-Za-z0-9_.-]+$'),
    stage           text,           -- as last registered (NULL: registered by no dispatcher yet)
    spec            text,           -- 'CRON m h dom mon dow (TZ)' or 'EVERY 30 s', for people
    last_tick       timestamptz,    -- the latest tick that enqueued (or found, by key) a message
    settled_through timestamptz NOT NULL,  -- every tick at or before this is handled
    next_tick       timestamptz,    -- the next tick as the registering dispatcher computed it;
                                    -- NULL: in no dispatcher's configuration any more
    updated_at      timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pepsi.schedule_ticks IS
    'known ticks of [schedule-NAME] sections: a tick is enqueued once, with its record';
