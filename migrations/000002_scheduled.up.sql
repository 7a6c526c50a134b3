-- The outbox table of github.com/acemq/outbox (table "outbox"), in the log layout: the default.
-- Generated from outbox.Schema; `outbox schema --table NAME` prints it for another name.

-- Messages written with a delay (Event.NotBefore), until they are due:
-- Store.Maintain (a relay, every 100ms) moves them into the table then.
-- last_error is set on one it could not move (its ID was written into
-- the table meanwhile): it stays here for an operator.
CREATE TABLE IF NOT EXISTS "outbox_scheduled" (
    id            uuid        PRIMARY KEY,
    event_type    text        NOT NULL,
    event_key     text        NOT NULL DEFAULT '',
    exchange      text        NOT NULL DEFAULT '',
    routing_key   text        NOT NULL DEFAULT '',
    payload       bytea       NOT NULL,
    content_type  text        NOT NULL DEFAULT 'application/json',
    headers       jsonb       NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now(),
    due           timestamptz NOT NULL,
    last_error    text
);

CREATE INDEX IF NOT EXISTS "outbox_scheduled_due_idx" ON "outbox_scheduled" (due)
    WHERE last_error IS NULL;
