-- The outbox table of github.com/acemq/outbox (table "outbox").
-- Generated from outbox.Schema; `outbox schema --table NAME` prints it for another name.

DROP TABLE IF EXISTS "outbox";
