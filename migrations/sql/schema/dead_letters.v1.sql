-- Dead letters: where kept terminal rows live, so the hot table stays compact.
--
-- pepsi.workqueue holds live rows (pending, running, paused) and done rows
-- until RETENTION purges them, oldest first.  Failed, timeout and expired
-- rows are kept until an operator requeues or purges them; kept in
-- workqueue, each sat among the ids of its time, so every leaf page of
-- workqueue_pkey kept a live entry or two and VACUUM could never free it:
-- the primary key grew by a page per ~360 ids ever issued, for ever.
-- pepsi.keep_dead_letters (the dispatcher, each heartbeat) moves them here,
-- with their ids, so workqueue's pages empty and are reused as done rows are
-- purged.  This table grows only with the rows kept, densely (ids arrive
-- roughly in order).
--
-- pepsi.messages is every message wherever it lives (workqueue UNION ALL
-- dead_letters): the functions that read terminal rows (get_message, list,
-- show, failed, the dashboard, metrics) read it; requeue_failed moves a row
-- back into workqueue with its id; purge deletes from both.
--
-- attempts and tracebacks lose their foreign keys to workqueue (a moved row
-- must keep its history); purge_done and purge delete a message's history
-- with it.
CREATE TABLE pepsi.dead_letters (
    workqueue_id bigint NOT NULL PRIMARY KEY,
    stage text NOT NULL,
    status text NOT NULL CHECK (status IN ('failed', 'timeout', 'expired')),
    payload jsonb NOT NULL,
    state jsonb NOT NULL,
    timeout timestamptz,
    retries integer NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    dispatcher_id bigint,
    priority integer NOT NULL,
    dedupe_key text,
    kept_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dead_letters_stage_idx ON pepsi.dead_letters (stage, workqueue_id);
COMMENT ON TABLE pepsi.dead_letters IS
    'kept failed, timeout and expired messages, moved out of workqueue (read pepsi.messages)';

CREATE VIEW pepsi.messages AS
SELECT w.workqueue_id, w.stage, w.status, w.payload, w.state, w.timeout, w.retries,
       w.created_at, w.updated_at, w.dispatcher_id, w.priority, w.dedupe_key
  FROM pepsi.workqueue AS w
UNION ALL
SELECT d.workqueue_id, d.stage, d.status, d.payload, d.state, d.timeout, d.retries,
       d.created_at, d.updated_at, d.dispatcher_id, d.priority, d.dedupe_key
  FROM pepsi.dead_letters AS d;
COMMENT ON VIEW pepsi.messages IS 'every message: pepsi.workqueue and pepsi.dead_letters';

ALTER TABLE pepsi.attempts DROP CONSTRAINT attempts_workqueue_id_fkey;
ALTER TABLE pepsi.tracebacks DROP CONSTRAINT tracebacks_workqueue_id_fkey;
