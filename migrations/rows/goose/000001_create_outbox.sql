-- The outbox table of github.com/acemq/outbox (table "outbox"), in the rows layout.
-- Generated from outbox.RowsSchema; `outbox schema --layout rows --table NAME` prints it for another name.

-- +goose Up
-- +goose StatementBegin
CREATE TABLE IF NOT EXISTS "outbox" (
    id            uuid        PRIMARY KEY,
    event_type    text        NOT NULL,
    event_key     text        NOT NULL DEFAULT '',
    exchange      text        NOT NULL DEFAULT '',
    routing_key   text        NOT NULL DEFAULT '',
    payload       bytea       NOT NULL,
    content_type  text        NOT NULL DEFAULT 'application/json',
    headers       jsonb       NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now(),
    available_at  timestamptz NOT NULL DEFAULT now(),
    attempts      integer     NOT NULL DEFAULT 0,
    last_error    text,
    claimed_until timestamptz,
    claim_token   uuid,
    published_at  timestamptz,
    parked_at     timestamptz
);

-- Claims walk this index: it holds only rows that are neither published nor
-- parked, so published history does not slow them down.
CREATE INDEX IF NOT EXISTS "outbox_claim_idx" ON "outbox" (id)
    WHERE published_at IS NULL AND parked_at IS NULL;

-- Parked rows, for operators and for counting what is pending.
CREATE INDEX IF NOT EXISTS "outbox_parked_idx" ON "outbox" (parked_at)
    WHERE published_at IS NULL AND parked_at IS NOT NULL;

-- Published rows by age, for purging.
CREATE INDEX IF NOT EXISTS "outbox_published_idx" ON "outbox" (published_at)
    WHERE published_at IS NOT NULL;
-- +goose StatementEnd

-- +goose Down
DROP TABLE IF EXISTS "outbox";
