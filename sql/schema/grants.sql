-- Least privilege: every privilege any pepsi role holds on schema pepsi, its
-- tables and its functions, at head, given here and nowhere else (no function
-- file and no migration from 0014 on carries a GRANT or REVOKE).  A migration
-- that creates or re-creates functions runs this file's frozen revision
-- (migrations/sql/schema/grants.vN.sql) after them; its downgrade runs the
-- previous revision.
-- Functions whose name starts with _ are granted to no role: SECURITY
-- DEFINER functions and triggers call them.
--
-- The file is authoritative and idempotent: it first takes every function and
-- table privilege from PUBLIC and from the five roles, then grants what each
-- role may do, so running it again, or on a database whose grants drifted,
-- leaves exactly this set.  The roles are listed per statement in the order
-- the migrations granted them, so the ACLs of a database migrated through the
-- inline-grant revisions (0003..0013) do not change when this file runs.
-- Other roles (a DBA's own grants to a login or monitoring role) are left as
-- they are.  Tables are private: no role but the owner writes them; everything
-- goes through SECURITY DEFINER functions with a pinned search_path.  One
-- exception: producers may INSERT the four columns an enqueue sets
-- (stage, payload, priority, dedupe_key) into pepsi.workqueue, so a bulk
-- producer can COPY (the fast path of pepsi_dispatch.enqueue).  Every other
-- column takes its default (pending, not held), and the table refuses what
-- pepsi.enqueue refuses (its CHECK a malformed stage name, its insert
-- trigger a payload that is not a JSON object or a malformed key, its
-- unique index a key a live message holds).
--
-- Who may call what is the GRANT statements below and nothing else: each
-- function file's `Callers:` header line, the roles table of docs/SQL.md, the
-- role list of docs/QUEUE.md, the edges of docs/INTERNALS.md's status
-- machine and the pepsi.* calls of pepsi-queue and pepsi-httpd are checked
-- against them (tests/python/unit/test_callers_match_grants.py).
-- The dispatcher cannot advance/finish/pause/fail (only a stage moves a
-- running row forward); a stage cannot claim; ingress can only enqueue.

REVOKE USAGE ON SCHEMA pepsi
    FROM pepsi_dispatcher, pepsi_stage, pepsi_ingress, pepsi_dashboard, pepsi_operator;
GRANT USAGE ON SCHEMA pepsi
    TO pepsi_operator, pepsi_dispatcher, pepsi_stage, pepsi_ingress, pepsi_dashboard;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pepsi
    FROM PUBLIC, pepsi_dispatcher, pepsi_stage, pepsi_ingress, pepsi_dashboard, pepsi_operator;
REVOKE ALL ON ALL TABLES IN SCHEMA pepsi
    FROM PUBLIC, pepsi_dispatcher, pepsi_stage, pepsi_ingress, pepsi_dashboard, pepsi_operator;

-- Producers and stage programs.
GRANT EXECUTE ON FUNCTION
    pepsi.enqueue(text, jsonb, timestamptz, integer, text),
    pepsi.enqueue_many(text, jsonb[], timestamptz, integer, text[]),
    pepsi.enqueue_lines(text, text[], timestamptz, integer, text[], text, bigint),
    pepsi.copy_mark(),
    pepsi.copied_ids(bigint, bigint),
    pepsi.key_holders(text[])
TO pepsi_ingress, pepsi_stage, pepsi_operator;
GRANT INSERT (stage, payload, priority, dedupe_key) ON pepsi.workqueue
TO pepsi_ingress, pepsi_stage, pepsi_operator;

-- Stage programs.
GRANT EXECUTE ON FUNCTION
    pepsi.advance(bigint, text, text, bigint),
    pepsi.finish(bigint, text, bigint),
    pepsi.finish_many(bigint[], text, bigint),
    pepsi.advance_many(bigint[], text, text, bigint),
    pepsi.pause(bigint, text, timestamptz, text, bigint),
    pepsi.fail(bigint, text, text, bigint),
    pepsi.hop(bigint, text, text, bigint),
    pepsi.set_state(bigint, text, jsonb, bigint),
    pepsi.note_traceback(bigint, text, text, bigint)
TO pepsi_stage;

GRANT EXECUTE ON FUNCTION
    pepsi.get_message(bigint),
    pepsi.get_messages(bigint[]),
    pepsi.stage_config()
TO pepsi_stage, pepsi_dispatcher;

-- Operators read the queue: a message by id, as a stage reads it (they may
-- SELECT the tables too; stage_config stays theirs to be denied).
GRANT EXECUTE ON FUNCTION
    pepsi.get_message(bigint),
    pepsi.get_messages(bigint[])
TO pepsi_operator;

GRANT EXECUTE ON FUNCTION
    pepsi.pin_messages(bigint[], bigint)
TO pepsi_stage;

GRANT EXECUTE ON FUNCTION
    pepsi.registered_stages()
TO pepsi_dispatcher, pepsi_ingress, pepsi_stage, pepsi_operator;

-- Which revision the schema is at (serve --check, pepsi-queue migrate
-- --current, the hint to migrate): everyone.
GRANT EXECUTE ON FUNCTION
    pepsi.schema_version()
TO pepsi_dispatcher, pepsi_stage, pepsi_ingress, pepsi_dashboard, pepsi_operator;

-- The dispatcher (coordinator/database/postgres.py) and operators (pepsi-queue), who use its role.
GRANT EXECUTE ON FUNCTION
    pepsi.register_dispatcher(text, integer, boolean),
    pepsi.heartbeat(bigint, jsonb),
    pepsi.unregister_dispatcher(bigint),
    pepsi.dispatcher_registered(bigint),
    pepsi.register_stages(bigint, text[], text[], integer[], interval[], interval[],
                          integer[], integer[]),
    pepsi.claim(bigint, text[], integer[], boolean, bigint[]),
    pepsi.claim_lines(bigint, text[], integer[], boolean, bigint[], integer[]),
    pepsi.requeue_due(text[], integer[], integer, interval),
    pepsi.reset_orphans(bigint, boolean, interval),
    pepsi.replicas_away(bigint, interval),
    pepsi.release(bigint, bigint[]),
    pepsi.record_dispatch_error(bigint, bigint[], text[], text[]),
    pepsi.check_answered(bigint, bigint[]),
    pepsi.held_ids(bigint),
    pepsi.stages_of(bigint[]),
    pepsi.flush_stats(text[], bigint[], bigint[], bigint[], bigint[], double precision[],
                      bigint, bigint, bigint, bigint),
    pepsi.purge_done(interval, integer),
    pepsi.keep_dead_letters(integer),
    pepsi.register_schedules(text[], text[], text[], timestamptz[]),
    pepsi.fire_schedule(text, timestamptz[], text, jsonb, integer, text, timestamptz)
TO pepsi_dispatcher;

-- Operators' commands (pepsi-queue), under pepsi_operator or the dispatcher's role.
GRANT EXECUTE ON FUNCTION
    pepsi.queue_counts(),
    pepsi.requeue_failed(text, bigint[]),
    pepsi.purge(text[], text, interval, boolean),
    pepsi.cancel(bigint[], text, boolean),
    pepsi.queue_overview(),
    pepsi.queue_dispatchers(),
    pepsi.stage_health(),
    pepsi.reschedule(bigint, timestamptz),
    pepsi.schedules()
TO pepsi_dispatcher, pepsi_operator;

-- Pausing and resuming a stage (and ending its hold-off): pepsi-queue
-- pause/resume and the dashboard's buttons, one function for both.
GRANT EXECUTE ON FUNCTION
    pepsi.pause_stage(text, boolean)
TO pepsi_dispatcher, pepsi_operator, pepsi_dashboard;

-- Requeueing and cancelling every message a list filter selects: pepsi-queue
-- requeue/cancel with a filter and the dashboard's "all matching" buttons,
-- one function each for both (not the dispatcher's role: pepsi_operator
-- existed before these).
GRANT EXECUTE ON FUNCTION
    pepsi.requeue_matching(text[], text, interval, jsonb, text, bigint, boolean),
    pepsi.cancel_matching(text[], text, interval, jsonb, bigint, boolean)
TO pepsi_operator, pepsi_dashboard;

-- Reading messages: operators, the dispatcher's role (operators used it
-- before pepsi_operator existed) and pepsi-httpd.
GRANT EXECUTE ON FUNCTION
    pepsi.failed_messages(text, integer, text),
    pepsi.failed_reasons(text),
    pepsi.message_story(bigint),
    pepsi.message_history(bigint),
    pepsi.list_messages(text[], text, interval, jsonb, bigint, integer, text)
TO pepsi_dispatcher, pepsi_operator, pepsi_dashboard;

-- pepsi-httpd: reads and acts only through these (no table privileges).
GRANT EXECUTE ON FUNCTION
    pepsi.dashboard_snapshot(interval),
    pepsi.dashboard_failed(text, text, integer),
    pepsi.dashboard_message(bigint),
    pepsi.dashboard_requeue(bigint[]),
    pepsi.dashboard_cancel(bigint[]),
    pepsi.dashboard_reschedule(bigint, timestamptz),
    pepsi.dashboard_schedules()
TO pepsi_dashboard;

-- Prometheus text for any HTTP front end (pepsi-httpd renders the same
-- families from dashboard_snapshot itself).
GRANT EXECUTE ON FUNCTION
    pepsi.metrics()
TO pepsi_dispatcher, pepsi_operator, pepsi_dashboard;

-- Operators read the tables directly under the dispatcher's role; the
-- dispatcher itself reads none (tests/python/unit/test_sql_no_table_access.py).
GRANT SELECT ON ALL TABLES IN SCHEMA pepsi TO pepsi_dispatcher;
-- pepsi_operator reads the queue, its history and statistics, not the
-- configuration overlay (pepsi.config may hold a WORKER_DSN's password; so
-- no stage_config() either).
GRANT SELECT ON pepsi.workqueue, pepsi.attempts, pepsi.stage_stats, pepsi.dispatch_stats,
                pepsi.dispatchers, pepsi.stages, pepsi.schedule_ticks,
                pepsi.dead_letters, pepsi.messages
TO pepsi_operator;
