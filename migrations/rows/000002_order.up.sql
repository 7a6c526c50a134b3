-- The outbox table of github.com/acemq/outbox (table "outbox"), in the rows layout.
-- Generated from outbox.RowsSchema; `outbox schema --layout rows --table NAME` prints it for another name.

-- The order the database assigns to messages as they are written: claims
-- follow it, and ordered mode keeps it per key. The roles that write events
-- need USAGE on the sequence (GRANT USAGE ON SEQUENCE ... TO ...). Keep its
-- CACHE at 1: sessions caching blocks of numbers would hand a later writer
-- a smaller one.
CREATE SEQUENCE IF NOT EXISTS "outbox_seq";
ALTER TABLE "outbox" ADD COLUMN IF NOT EXISTS seq bigint;
ALTER TABLE "outbox" ALTER COLUMN seq SET DEFAULT nextval('"outbox_seq"');
ALTER SEQUENCE "outbox_seq" OWNED BY "outbox".seq;

-- When an operator gave up on a parked message (Store.Discard); the row is
-- kept, with its attempts and last error.
ALTER TABLE "outbox" ADD COLUMN IF NOT EXISTS discarded_at timestamptz;

-- Ordered mode sets aside the messages of a key whose first message failed
-- (held), so that claims do not walk over them until it is published,
-- retried or discarded.
ALTER TABLE "outbox" ADD COLUMN IF NOT EXISTS held boolean NOT NULL DEFAULT false;

-- Rows written before this version that are still to be published take
-- their order from their time-ordered ids, before every later row.
UPDATE "outbox" AS o SET seq = n.seq
FROM (SELECT id, nextval('"outbox_seq"') AS seq
      FROM (SELECT id FROM "outbox" WHERE seq IS NULL AND published_at IS NULL ORDER BY id) AS p) AS n
WHERE o.id = n.id;

-- Claims walk this index, in the order of seq: it holds only rows that are
-- neither published, nor parked, nor held, so that neither published
-- history nor the messages of blocked keys slow them down.
DROP INDEX IF EXISTS "outbox_claim_idx";
CREATE INDEX IF NOT EXISTS "outbox_claim_seq_idx" ON "outbox" (seq)
    WHERE published_at IS NULL AND parked_at IS NULL AND NOT held;

-- Ordered mode finds the first unpublished message of a key here.
CREATE INDEX IF NOT EXISTS "outbox_key_idx" ON "outbox" (event_key, seq)
    WHERE published_at IS NULL AND event_key <> '';

-- The held messages, by key.
CREATE INDEX IF NOT EXISTS "outbox_held_idx" ON "outbox" (event_key, seq)
    WHERE held AND published_at IS NULL AND parked_at IS NULL;
