-- The outbox table of github.com/acemq/outbox (table "outbox"), in the log layout: the default.
-- Generated from outbox.Schema; `outbox schema --table NAME` prints it for another name.

DROP TABLE IF EXISTS "outbox_scheduled";
