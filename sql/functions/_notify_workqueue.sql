-- pepsi._notify_workqueue() → trigger
--   Statement-level AFTER INSERT trigger on pepsi.workqueue: one NOTIFY on
--   channel 'workqueue' per INSERT statement, however many rows it inserted.
--   Empty payload: PostgreSQL folds identical notifications of one
--   transaction into one, which is what a wake-up hint wants.
--   Reads/writes: nothing.  Locks: none.
--   Callers: granted to nobody (the INSERT trigger of pepsi.workqueue).
CREATE OR REPLACE FUNCTION pepsi._notify_workqueue()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify('workqueue', '');
    RETURN NULL;
END
$$;
