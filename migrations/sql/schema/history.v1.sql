-- Operators and message history (migration 0018).
--
--   pepsi_operator    NOLOGIN group role for people (pepsi-queue): reads the
--                     queue, enqueues, lists, shows, requeues, cancels and
--                     purges through the functions grants.v4.sql names; it
--                     cannot claim, release or move a running row.  A DBA
--                     gives a person's login role membership:
--                         CREATE ROLE alice LOGIN IN ROLE pepsi_operator;
--   pepsi.attempts    the bounded history of each message: one row per
--                     attempt that did not end in success (paused, failed,
--                     crash, timeout, released, cancelled, expired), the last
--                     20 per message.  Written only by the trigger
--                     workqueue_attempts (pepsi._record_attempt), which fires
--                     on none of the success path's updates (claim, advance,
--                     finish, hop, requeue): a message that just finishes
--                     pays no write for its history.  The successful last
--                     attempt is read from the row itself
--                     (pepsi.message_history).
--   pepsi.tracebacks  a stage program's exception traceback, noted by the SDK
--                     (pepsi.note_traceback) just before it answers non-zero;
--                     the trigger moves it into that failure's attempt row.
-- Both tables go with their message (ON DELETE CASCADE).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pepsi_operator') THEN
        BEGIN
            CREATE ROLE pepsi_operator NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- created concurrently by another database's migration
        END;
    END IF;
END
$$;

CREATE TABLE pepsi.attempts (
    workqueue_id bigint      NOT NULL REFERENCES pepsi.workqueue ON DELETE CASCADE,
    attempt      integer     NOT NULL,
    stage        text        NOT NULL,
    started_at   timestamptz,
    ended_at     timestamptz NOT NULL DEFAULT now(),
    outcome      text        NOT NULL,
    reason       text,
    traceback    text,
    PRIMARY KEY (workqueue_id, attempt)
);

CREATE TABLE pepsi.tracebacks (
    workqueue_id bigint      PRIMARY KEY REFERENCES pepsi.workqueue ON DELETE CASCADE,
    traceback    text        NOT NULL,
    noted_at     timestamptz NOT NULL DEFAULT now()
);
