-- The inbox table of github.com/acemq/outbox/inbox (table "inbox").
-- Generated from inbox.Schema; `outbox inbox schema --table NAME` prints it for another name.

DROP TABLE IF EXISTS "inbox";
