-- The outbox table of github.com/acemq/outbox (table "outbox"), in the rows layout.
-- Generated from outbox.RowsSchema; `outbox schema --layout rows --table NAME` prints it for another name.

DROP TABLE IF EXISTS "outbox_scheduled";
