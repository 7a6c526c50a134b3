-- The outbox table of github.com/acemq/outbox (table "outbox"), in the log layout: the default.
-- Generated from outbox.Schema; `outbox schema --table NAME` prints it for another name.

DROP VIEW IF EXISTS "outbox_messages";
DROP FUNCTION IF EXISTS "outbox_claim"(integer, bigint, bigint, uuid, bigint);
DROP TABLE IF EXISTS "outbox_failed", "outbox_settle", "outbox_batch", "outbox_log";
DROP TABLE IF EXISTS "outbox";
DROP FUNCTION IF EXISTS "outbox_id_check"();
DROP FUNCTION IF EXISTS "outbox_order"();
