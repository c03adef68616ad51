-- Once, when set_state v3 comes in: a running row can carry 'delayed_until'
-- only if a stage wrote it through set_state v2 (enqueue's mark is removed
-- before a delayed row ever runs).  Remove it, so pausing such a row counts a
-- retry like any other pause.  Running rows only: workqueue_running_idx.
UPDATE pepsi.workqueue AS w
   SET state = w.state - 'delayed_until'
 WHERE w.status = 'running' AND w.state ? 'delayed_until';
