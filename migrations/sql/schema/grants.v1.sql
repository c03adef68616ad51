-- Least privilege.  Tables are private: no role but the owner writes them
-- directly; everything goes through SECURITY DEFINER functions with a pinned
-- search_path.  EXECUTE is revoked from PUBLIC on every function.
--
--   role              schema  tables                 functions
--   pepsi_ingress     USAGE   -                      enqueue, enqueue_many
--   pepsi_stage       USAGE   -                      enqueue, enqueue_many, advance, finish,
--                                                    pause, fail, get_message, get_messages,
--                                                    set_state
--   pepsi_dispatcher  USAGE   SELECT on all          register_dispatcher, heartbeat,
--                                                    unregister_dispatcher, claim, requeue_due,
--                                                    reset_orphans, release,
--                                                    record_dispatch_error, check_answered,
--                                                    flush_stats, purge_done, metrics,
--                                                    queue_counts, requeue_failed,
--                                                    get_message, get_messages
-- The dispatcher cannot advance/finish/pause/fail (only a stage moves a
-- running row forward); a stage cannot claim; ingress can only enqueue.

GRANT USAGE ON SCHEMA pepsi TO pepsi_dispatcher, pepsi_stage, pepsi_ingress;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pepsi FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
    pepsi.enqueue(text, jsonb),
    pepsi.enqueue_many(text, jsonb[])
TO pepsi_ingress, pepsi_stage;

GRANT EXECUTE ON FUNCTION
    pepsi.advance(bigint, text, text, bigint),
    pepsi.finish(bigint, text, bigint),
    pepsi.pause(bigint, text, timestamptz, text, bigint),
    pepsi.fail(bigint, text, text, bigint),
    pepsi.set_state(bigint, text, jsonb, bigint)
TO pepsi_stage;

GRANT EXECUTE ON FUNCTION
    pepsi.get_message(bigint),
    pepsi.get_messages(bigint[])
TO pepsi_stage, pepsi_dispatcher;

GRANT EXECUTE ON FUNCTION
    pepsi.register_dispatcher(text, integer, boolean),
    pepsi.heartbeat(bigint),
    pepsi.unregister_dispatcher(bigint),
    pepsi.claim(bigint, text[], integer[], boolean),
    pepsi.requeue_due(text[], integer[], integer, interval),
    pepsi.reset_orphans(bigint, boolean, interval),
    pepsi.release(bigint, bigint[]),
    pepsi.record_dispatch_error(bigint, bigint[], text[], text[]),
    pepsi.check_answered(bigint, bigint[]),
    pepsi.flush_stats(text[], bigint[], bigint[], bigint[], bigint[], double precision[],
                      bigint, bigint, bigint, bigint),
    pepsi.purge_done(interval, integer),
    pepsi.metrics(),
    pepsi.queue_counts(),
    pepsi.requeue_failed(text, bigint[])
TO pepsi_dispatcher;

GRANT SELECT ON ALL TABLES IN SCHEMA pepsi TO pepsi_dispatcher;
