-- pepsi.cancel: pending and paused rows (only) become failed, 'cancelled by operator'.
BEGIN;
SELECT plan(13);

CREATE FUNCTION pg_temp.row_in(s text, st text) RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO pepsi.workqueue (stage, status, dispatcher_id, timeout)
    VALUES (s, st, CASE WHEN st = 'running' THEN 1 END,
            CASE WHEN st = 'paused' THEN now() + interval '1 h' END)
    RETURNING workqueue_id $$;
SELECT pg_temp.row_in('a', 'pending') AS a_pending, pg_temp.row_in('a', 'paused') AS a_paused,
       pg_temp.row_in('a', 'running') AS a_running, pg_temp.row_in('a', 'done') AS a_done,
       pg_temp.row_in('b', 'pending') AS b_pending, pg_temp.row_in('b', 'pending') AS b_pending2,
       pg_temp.row_in('c', 'pending') AS c_pending, pg_temp.row_in('c', 'failed') AS c_failed \gset

SELECT throws_ok($$SELECT pepsi.cancel()$$, '22023', NULL, 'cancel without a selection is refused');
SELECT throws_ok($$SELECT pepsi.cancel(NULL, 'a', true)$$, '22023', NULL,
                 'all_rows cannot be combined with a stage');

SELECT is(pepsi.cancel(ARRAY[:a_pending, :a_running, :a_done, :b_pending]::bigint[]), 2,
          'by ids: only the pending ones among them');
SELECT results_eq(format('SELECT status, state->>''error'', timeout FROM pepsi.workqueue WHERE workqueue_id = %s', :a_pending),
    $$VALUES ('failed'::text, 'cancelled by operator'::text, NULL::timestamptz)$$,
    'a cancelled row is failed with error = cancelled by operator');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :a_running), 'running',
          'a running row is never cancelled');
SELECT is((SELECT status FROM pepsi.workqueue WHERE workqueue_id = :a_done), 'done',
          'a done row is never cancelled');

SELECT is(pepsi.cancel(stage => 'a'), 1, 'by stage: the paused row left at a');
SELECT results_eq(format('SELECT status, timeout, state->>''cancelled_status'' FROM pepsi.workqueue WHERE workqueue_id = %s', :a_paused),
    $$VALUES ('failed'::text, NULL::timestamptz, 'paused'::text)$$,
    'a paused row is cancelled too, its timeout cleared, the old status noted');
SELECT is(pepsi.cancel(ARRAY[:b_pending2, :c_pending]::bigint[], 'b'), 1,
          'ids and stage together: both must match');
SELECT is(pepsi.cancel(all_rows => true), 1, 'all: every pending/paused row left');
SELECT is((SELECT count(*)::int FROM pepsi.workqueue WHERE status IN ('pending', 'paused')), 0,
          'nothing pending or paused is left');
SELECT is((SELECT error FROM pepsi.failed_messages() WHERE workqueue_id = :c_pending),
          'cancelled by operator', 'failed_messages shows the cancellation as the reason');
SELECT is(pepsi.requeue_failed(NULL, ARRAY[:a_pending]::bigint[]), 1,
          'a cancelled row can be requeued');

SELECT * FROM finish();
ROLLBACK;
