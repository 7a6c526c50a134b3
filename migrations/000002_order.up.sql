-- The outbox table of github.com/acemq/outbox (table "outbox").
-- Generated from outbox.Schema; `outbox schema --table NAME` prints it for another name.

-- The order the database assigns to messages as they are written: claims
-- follow it, and ordered mode keeps it per key.
CREATE SEQUENCE IF NOT EXISTS "outbox_seq";
ALTER TABLE "outbox" ADD COLUMN IF NOT EXISTS seq bigint;
ALTER TABLE "outbox" ALTER COLUMN seq SET DEFAULT nextval('"outbox_seq"');
ALTER SEQUENCE "outbox_seq" OWNED BY "outbox".seq;

-- When an operator gave up on a parked message (Store.Discard); the row is
-- kept, with its attempts and last error.
ALTER TABLE "outbox" ADD COLUMN IF NOT EXISTS discarded_at timestamptz;

-- Rows written before this version that are still to be published take
-- their order from their time-ordered ids, before every later row.
UPDATE "outbox" AS o SET seq = n.seq
FROM (SELECT id, nextval('"outbox_seq"') AS seq
      FROM (SELECT id FROM "outbox" WHERE seq IS NULL AND published_at IS NULL ORDER BY id) AS p) AS n
WHERE o.id = n.id;

-- Claims walk this index, in the order of seq: it holds only rows that are
-- neither published nor parked, so published history does not slow them.
DROP INDEX IF EXISTS "outbox_claim_idx";
CREATE INDEX IF NOT EXISTS "outbox_claim_seq_idx" ON "outbox" (seq)
    WHERE published_at IS NULL AND parked_at IS NULL;

-- Ordered mode finds the first unpublished message of a key here.
CREATE INDEX IF NOT EXISTS "outbox_key_idx" ON "outbox" (event_key, seq)
    WHERE published_at IS NULL AND event_key <> '';
