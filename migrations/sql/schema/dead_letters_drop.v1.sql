-- Undo dead_letters.v1.sql (its migration's downgrade): the kept rows go back
-- into workqueue with their ids, the history of messages that no longer exist
-- is deleted, and the foreign keys come back.
INSERT INTO pepsi.workqueue
       (workqueue_id, stage, status, payload, state, timeout, retries, created_at, updated_at,
        dispatcher_id, priority, dedupe_key)
OVERRIDING SYSTEM VALUE
SELECT d.workqueue_id, d.stage, d.status, d.payload, d.state, d.timeout, d.retries,
       d.created_at, d.updated_at, d.dispatcher_id, d.priority, d.dedupe_key
  FROM pepsi.dead_letters AS d;
DROP VIEW pepsi.messages;
DROP TABLE pepsi.dead_letters;
DELETE FROM pepsi.attempts AS a
 WHERE NOT EXISTS (SELECT FROM pepsi.workqueue AS w WHERE w.workqueue_id = a.workqueue_id);
DELETE FROM pepsi.tracebacks AS t
 WHERE NOT EXISTS (SELECT FROM pepsi.workqueue AS w WHERE w.workqueue_id = t.workqueue_id);
ALTER TABLE pepsi.attempts ADD CONSTRAINT attempts_workqueue_id_fkey
    FOREIGN KEY (workqueue_id) REFERENCES pepsi.workqueue (workqueue_id) ON DELETE CASCADE;
ALTER TABLE pepsi.tracebacks ADD CONSTRAINT tracebacks_workqueue_id_fkey
    FOREIGN KEY (workqueue_id) REFERENCES pepsi.workqueue (workqueue_id) ON DELETE CASCADE;
