-- Undoes payload_object.v1.sql (the downgrade of migration 0041).
ALTER TABLE pepsi.workqueue DROP CONSTRAINT workqueue_payload_object;
