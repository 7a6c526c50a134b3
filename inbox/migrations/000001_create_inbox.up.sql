-- The inbox table of github.com/acemq/outbox/inbox (table "inbox").
-- Generated from inbox.Schema; `outbox inbox schema --table NAME` prints it for another name.

CREATE TABLE IF NOT EXISTS "inbox" (
    consumer    text        NOT NULL,
    message_id  text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    handled_at  timestamptz,
    attempts    integer     NOT NULL DEFAULT 0,
    last_error  text,
    dead_at     timestamptz,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS "inbox_received_idx" ON "inbox" (received_at);
