-- The outbox table of github.com/acemq/outbox (table "outbox"), in the rows layout.
-- Generated from outbox.RowsSchema; `outbox schema --layout rows --table NAME` prints it for another name.

CREATE INDEX IF NOT EXISTS "outbox_claim_idx" ON "outbox" (id)
    WHERE published_at IS NULL AND parked_at IS NULL;
DROP INDEX IF EXISTS "outbox_claim_seq_idx";
DROP INDEX IF EXISTS "outbox_key_idx";
DROP INDEX IF EXISTS "outbox_held_idx";
ALTER TABLE "outbox" DROP COLUMN IF EXISTS held;
ALTER TABLE "outbox" DROP COLUMN IF EXISTS discarded_at;
ALTER TABLE "outbox" DROP COLUMN IF EXISTS seq;
DROP SEQUENCE IF EXISTS "outbox_seq";
