-- The outbox table of github.com/acemq/outbox (table "outbox"), in the log layout: the default.
-- Generated from outbox.Schema; `outbox schema --table NAME` prints it for another name.

-- +goose Up
-- +goose StatementBegin
-- An outbox table of the log layout: events are only ever inserted.
CREATE SEQUENCE IF NOT EXISTS "outbox_seq";
-- ord numbers the rows of an ordered table in the order their writers took
-- their key's turn (see the order trigger): NULL on an unordered table.
CREATE SEQUENCE IF NOT EXISTS "outbox_ord_seq" CACHE 1;

-- tx is the writing transaction's id: relays take what became visible
-- between two snapshots, so a transaction that commits late is never
-- skipped, whatever seq it drew. The partition of a row is its chunk of
-- 1000000 seq numbers, in rotation over 16 partitions: history goes
-- away by TRUNCATE of a partition every message of which is settled.
CREATE TABLE IF NOT EXISTS "outbox" (
    id           uuid        NOT NULL,
    seq          bigint      NOT NULL DEFAULT nextval('"outbox_seq"'),
    tx           xid8        NOT NULL DEFAULT pg_current_xact_id(),
    event_type   text        NOT NULL,
    event_key    text        NOT NULL DEFAULT '',
    exchange     text        NOT NULL DEFAULT '',
    routing_key  text        NOT NULL DEFAULT '',
    payload      bytea       NOT NULL,
    content_type text        NOT NULL DEFAULT 'application/json',
    headers      jsonb       NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    ord          bigint
) PARTITION BY LIST (((seq / 1000000) % 16));
ALTER TABLE "outbox" ADD COLUMN IF NOT EXISTS ord bigint;
ALTER SEQUENCE "outbox_seq" OWNED BY "outbox".seq;
ALTER SEQUENCE "outbox_ord_seq" OWNED BY "outbox".ord;
CREATE TABLE IF NOT EXISTS "outbox_p00" PARTITION OF "outbox" FOR VALUES IN (0);
CREATE TABLE IF NOT EXISTS "outbox_p01" PARTITION OF "outbox" FOR VALUES IN (1);
CREATE TABLE IF NOT EXISTS "outbox_p02" PARTITION OF "outbox" FOR VALUES IN (2);
CREATE TABLE IF NOT EXISTS "outbox_p03" PARTITION OF "outbox" FOR VALUES IN (3);
CREATE TABLE IF NOT EXISTS "outbox_p04" PARTITION OF "outbox" FOR VALUES IN (4);
CREATE TABLE IF NOT EXISTS "outbox_p05" PARTITION OF "outbox" FOR VALUES IN (5);
CREATE TABLE IF NOT EXISTS "outbox_p06" PARTITION OF "outbox" FOR VALUES IN (6);
CREATE TABLE IF NOT EXISTS "outbox_p07" PARTITION OF "outbox" FOR VALUES IN (7);
CREATE TABLE IF NOT EXISTS "outbox_p08" PARTITION OF "outbox" FOR VALUES IN (8);
CREATE TABLE IF NOT EXISTS "outbox_p09" PARTITION OF "outbox" FOR VALUES IN (9);
CREATE TABLE IF NOT EXISTS "outbox_p10" PARTITION OF "outbox" FOR VALUES IN (10);
CREATE TABLE IF NOT EXISTS "outbox_p11" PARTITION OF "outbox" FOR VALUES IN (11);
CREATE TABLE IF NOT EXISTS "outbox_p12" PARTITION OF "outbox" FOR VALUES IN (12);
CREATE TABLE IF NOT EXISTS "outbox_p13" PARTITION OF "outbox" FOR VALUES IN (13);
CREATE TABLE IF NOT EXISTS "outbox_p14" PARTITION OF "outbox" FOR VALUES IN (14);
CREATE TABLE IF NOT EXISTS "outbox_p15" PARTITION OF "outbox" FOR VALUES IN (15);

-- Relays read the events of a window of transactions in this order.
CREATE INDEX IF NOT EXISTS "outbox_tx_idx" ON "outbox" (tx, seq);
-- An event's id is unique in the table (ErrDuplicateID): PostgreSQL
-- cannot index a partitioned table uniquely on a column that is not its
-- partition key, so each partition has a unique index on id (which
-- operators find messages by), and the trigger below looks in the others.
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_p00_id_key" ON "outbox_p00" (id);
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_p01_id_key" ON "outbox_p01" (id);
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_p02_id_key" ON "outbox_p02" (id);
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_p03_id_key" ON "outbox_p03" (id);
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_p04_id_key" ON "outbox_p04" (id);
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_p05_id_key" ON "outbox_p05" (id);
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_p06_id_key" ON "outbox_p06" (id);
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_p07_id_key" ON "outbox_p07" (id);
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_p08_id_key" ON "outbox_p08" (id);
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_p09_id_key" ON "outbox_p09" (id);
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_p10_id_key" ON "outbox_p10" (id);
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_p11_id_key" ON "outbox_p11" (id);
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_p12_id_key" ON "outbox_p12" (id);
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_p13_id_key" ON "outbox_p13" (id);
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_p14_id_key" ON "outbox_p14" (id);
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_p15_id_key" ON "outbox_p15" (id);
DROP INDEX IF EXISTS "outbox_id_idx";
CREATE OR REPLACE FUNCTION "outbox_id_check"() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    dup uuid;
BEGIN
    SELECT n.id INTO dup FROM outbox_new AS n
    WHERE EXISTS (SELECT 1 FROM "outbox" AS o WHERE o.id = n.id AND o.seq <> n.seq) LIMIT 1;
    IF FOUND THEN
        RAISE unique_violation USING MESSAGE = format('event id %s is already in table %s', dup, 'outbox'),
            DETAIL = format('Key (id)=(%s) already exists.', dup);
    END IF;
    RETURN NULL;
END
$$;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger WHERE tgrelid = '"outbox"'::regclass AND tgname = 'outbox_id_check') THEN
        CREATE TRIGGER "outbox_id_check" AFTER INSERT ON "outbox"
            REFERENCING NEW TABLE AS outbox_new FOR EACH STATEMENT EXECUTE FUNCTION "outbox_id_check"();
    END IF;
END
$$;
-- Relays of an ordered table read a window in the order of ord.
CREATE INDEX IF NOT EXISTS "outbox_ord_idx" ON "outbox" (ord) WHERE ord IS NOT NULL;

-- One row per claim, never updated: which window of transactions
-- (between snapshots lo and hi) and which part of it ((after, last] in
-- the order of tx, seq) a relay took, under which lease. A batch whose
-- lease ran out is claimed again under the next gen. On an ordered table
-- a window is taken in the order of ord: such a batch has last_tx 0 and
-- its part is (after_seq, last_seq] in ord; keys are the keys of its
-- messages (claimed while the table is ordered; NULL otherwise).
CREATE TABLE IF NOT EXISTS "outbox_batch" (
    batch_id    bigint      NOT NULL,
    gen         integer     NOT NULL,
    lo          pg_snapshot NOT NULL,
    hi          pg_snapshot NOT NULL,
    after_tx    xid8        NOT NULL,
    after_seq   bigint      NOT NULL,
    last_tx     xid8        NOT NULL,
    last_seq    bigint      NOT NULL,
    n           integer     NOT NULL,
    more        boolean     NOT NULL,
    token       uuid        NOT NULL,
    lease_until timestamptz NOT NULL,
    claimed_at  timestamptz NOT NULL DEFAULT now(),
    keys        text[]
) PARTITION BY LIST (((batch_id / 1024) % 4));
ALTER TABLE "outbox_batch" ADD COLUMN IF NOT EXISTS keys text[];
CREATE INDEX IF NOT EXISTS "outbox_batch_idx" ON "outbox_batch" (batch_id, gen);

-- What became of the messages of a batch, never updated: published (p),
-- failed or set aside behind a failed message of their key (f, then kept
-- in the failed table) or released (r).
CREATE TABLE IF NOT EXISTS "outbox_settle" (
    batch_id bigint      NOT NULL,
    gen      integer     NOT NULL,
    kind     "char"      NOT NULL,
    seqs     bigint[]    NOT NULL,
    at       timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (((batch_id / 1024) % 4));
CREATE TABLE IF NOT EXISTS "outbox_batch_p0" PARTITION OF "outbox_batch" FOR VALUES IN (0);
CREATE TABLE IF NOT EXISTS "outbox_settle_p0" PARTITION OF "outbox_settle" FOR VALUES IN (0);
CREATE TABLE IF NOT EXISTS "outbox_batch_p1" PARTITION OF "outbox_batch" FOR VALUES IN (1);
CREATE TABLE IF NOT EXISTS "outbox_settle_p1" PARTITION OF "outbox_settle" FOR VALUES IN (1);
CREATE TABLE IF NOT EXISTS "outbox_batch_p2" PARTITION OF "outbox_batch" FOR VALUES IN (2);
CREATE TABLE IF NOT EXISTS "outbox_settle_p2" PARTITION OF "outbox_settle" FOR VALUES IN (2);
CREATE TABLE IF NOT EXISTS "outbox_batch_p3" PARTITION OF "outbox_batch" FOR VALUES IN (3);
CREATE TABLE IF NOT EXISTS "outbox_settle_p3" PARTITION OF "outbox_settle" FOR VALUES IN (3);
CREATE INDEX IF NOT EXISTS "outbox_settle_idx" ON "outbox_settle" (batch_id, gen);

-- Messages that failed at least once, and on an ordered table those held
-- behind them (attempts 0, no last_error): a copy of the event and its
-- attempts, backoff and claim, until it is published or discarded. Its
-- rows change with failures, never with the traffic.
CREATE TABLE IF NOT EXISTS "outbox_failed" (
    id            uuid        PRIMARY KEY,
    seq           bigint      NOT NULL,
    event_type    text        NOT NULL,
    event_key     text        NOT NULL,
    exchange      text        NOT NULL,
    routing_key   text        NOT NULL,
    payload       bytea       NOT NULL,
    content_type  text        NOT NULL,
    headers       jsonb       NOT NULL,
    created_at    timestamptz NOT NULL,
    attempts      integer     NOT NULL,
    last_error    text,
    available_at  timestamptz NOT NULL,
    claimed_until timestamptz,
    claim_token   uuid,
    parked_at     timestamptz,
    published_at  timestamptz,
    discarded_at  timestamptz,
    ord           bigint
);
ALTER TABLE "outbox_failed" ADD COLUMN IF NOT EXISTS ord bigint;
CREATE INDEX IF NOT EXISTS "outbox_failed_due_idx" ON "outbox_failed" (available_at)
    WHERE published_at IS NULL AND parked_at IS NULL AND discarded_at IS NULL;
-- Claims of an ordered table ask whether a key has a message here, and
-- walk the keys and each key's messages in order.
CREATE INDEX IF NOT EXISTS "outbox_failed_key_idx" ON "outbox_failed" (event_key, (coalesce(ord, 0)), seq)
    WHERE published_at IS NULL AND discarded_at IS NULL;

-- Every event with its state, in the columns of the rows layout, for
-- operators and tests: what became of a message. It reads the settle
-- table for each event: use it to look, not in a hot path.
CREATE OR REPLACE VIEW "outbox_messages" AS
SELECT o.id, o.seq, o.tx, o.event_type, o.event_key, o.exchange, o.routing_key, o.payload, o.content_type, o.headers, o.created_at,
    coalesce(f.available_at, o.created_at) AS available_at,
    coalesce(f.attempts, 0) AS attempts,
    f.last_error,
    CASE WHEN f.id IS NOT NULL THEN f.claimed_until ELSE c.lease_until END AS claimed_until,
    CASE WHEN f.id IS NOT NULL THEN f.claim_token ELSE c.token END AS claim_token,
    CASE WHEN f.id IS NOT NULL THEN coalesce(f.published_at, f.discarded_at)
         ELSE (SELECT min(s.at) FROM "outbox_settle" AS s WHERE s.kind = 'p' AND s.seqs @> ARRAY[o.seq]) END AS published_at,
    f.parked_at,
    f.discarded_at,
    coalesce(f.last_error IS NULL AND f.published_at IS NULL AND f.discarded_at IS NULL, false) AS held
FROM "outbox" AS o
LEFT JOIN "outbox_failed" AS f ON f.id = o.id
LEFT JOIN LATERAL (
    SELECT b.lease_until, b.token FROM "outbox_batch" AS b
    WHERE pg_visible_in_snapshot(o.tx, b.hi) AND NOT pg_visible_in_snapshot(o.tx, b.lo)
      AND CASE WHEN b.last_tx = '0' THEN o.ord > b.after_seq AND o.ord <= b.last_seq
          ELSE (o.tx, o.seq) > (b.after_tx, b.after_seq) AND (o.tx, o.seq) <= (b.last_tx, b.last_seq) END
      AND NOT EXISTS (SELECT 1 FROM "outbox_batch" AS x WHERE x.batch_id = b.batch_id AND x.gen > b.gen)
      AND NOT EXISTS (SELECT 1 FROM "outbox_settle" AS s WHERE s.batch_id = b.batch_id AND s.seqs @> ARRAY[o.seq] AND s.kind IN ('p', 'f', 'r'))
    LIMIT 1) AS c ON true;

-- Marks the table as one of the log layout, and its sizes. ordered_from
-- is the snapshot at which the table was last made ordered, until what
-- was committed before it (without ord) is taken, in the order of tx, seq.
CREATE TABLE IF NOT EXISTS "outbox_log" (
    version       integer NOT NULL,
    chunk         bigint  NOT NULL,
    parts         integer NOT NULL,
    batch_chunk   bigint  NOT NULL,
    batch_parts   integer NOT NULL,
    ordered_from  pg_snapshot
);
ALTER TABLE "outbox_log" ADD COLUMN IF NOT EXISTS ordered_from pg_snapshot;
-- Relays compute partitions from its sizes: a row deleted or changed by
-- hand is made again from what the tables are partitioned by.
DELETE FROM "outbox_log" WHERE ctid NOT IN (SELECT ctid FROM "outbox_log" ORDER BY version DESC LIMIT 1);
INSERT INTO "outbox_log" (version, chunk, parts, batch_chunk, batch_parts)
SELECT 2, 1000000, 16, 1024, 4 WHERE NOT EXISTS (SELECT 1 FROM "outbox_log");
UPDATE "outbox_log" AS m SET chunk = k.chunk, parts = k.parts, batch_chunk = k.bchunk, batch_parts = k.bparts
FROM (SELECT coalesce(substring(e.def FROM '\(seq / (\d+)\)')::bigint, 1000000) AS chunk,
          coalesce(substring(e.def FROM '% \((\d+)\)')::integer, 16) AS parts,
          coalesce(substring(b.def FROM '\(batch_id / (\d+)\)')::bigint, 1024) AS bchunk,
          coalesce(substring(b.def FROM '% \((\d+)\)')::integer, 4) AS bparts
      FROM (SELECT pg_get_partkeydef('"outbox"'::regclass) AS def) AS e,
           (SELECT pg_get_partkeydef('"outbox_batch"'::regclass) AS def) AS b) AS k
WHERE (m.chunk, m.parts, m.batch_chunk, m.batch_parts) IS DISTINCT FROM (k.chunk, k.parts, k.bchunk, k.bparts);

-- A claim of the next events: in one transaction, under the table's claim
-- lock, the next part of the current window of transactions, or the next
-- window when it is drained, recorded as a batch. Each statement of the
-- function takes a fresh snapshot: the cursor is read after the lock.
--
-- On an ordered table (it has its order trigger) a claim takes a window in
-- the order of ord, which is the order of commit for the rows of a key, and
-- stops before the first message whose key an unfinished batch holds (from
-- batch low on, the caller's low-water mark, or from the first when no
-- batch is that high: the table was emptied and its ids began again), so
-- that two batches never publish messages of one key; a batch claimed
-- while the table was unordered holds every key. It says of each message
-- whether its key is blocked: it has a message in the failed table, or,
-- when the batch's first message is held (a key with a backlog in flight),
-- an unfinished batch holds it. The caller sets those aside in the failed
-- table, behind the messages of their key. table_ordered says whether the
-- table was ordered when the claim ran.
DROP FUNCTION IF EXISTS "outbox_claim"(integer, bigint, bigint, uuid);
DROP FUNCTION IF EXISTS "outbox_claim"(integer, bigint, bigint, uuid, bigint);
CREATE FUNCTION "outbox_claim"(n integer, lease_us bigint, max_bytes bigint, claim_token uuid, low bigint)
RETURNS TABLE (batch_id bigint, lease_until timestamptz, id uuid, seq bigint, tx xid8, event_type text, event_key text, exchange text,
    routing_key text, payload bytea, content_type text, headers jsonb, created_at timestamptz, ord bigint, blocked boolean,
    table_ordered boolean)
-- Generic plans: a custom plan, made for the values of each call, reads
-- the partitions' statistics, which make a window of recent transactions
-- look like most of the table (or, never analysed, like anything): the
-- first five claims of every session, and every claim when PostgreSQL
-- keeps choosing custom plans, took 23-50 ms where the generic plan (index
-- scans in the order of the indexes, under LIMIT) takes 1-2 ms.
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    l        record;
    m        record;
    bid      bigint := 1;
    lo       pg_snapshot := '3:3:';
    hi       pg_snapshot;
    a_tx     xid8 := '0';
    a_seq    bigint := 0;
    by_ord   boolean := false;
    ordered  boolean;
    w_min    bigint;
    w_nulls  boolean;
    every    boolean := false;
    held     text[] := '{}';
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('outbox:claim:"outbox_batch"', 0));
    -- The batch row need not reach the disk before the claim returns: see
    -- asyncCommit.
    PERFORM set_config('synchronous_commit', 'off', true);
    ordered := EXISTS (SELECT 1 FROM pg_catalog.pg_trigger WHERE tgrelid = '"outbox"'::regclass AND tgname = 'outbox_order' AND tgenabled <> 'D');
    IF ordered THEN
        WITH u AS (
	SELECT b.keys FROM "outbox_batch" AS b
	WHERE b.batch_id >= (CASE WHEN low::bigint > (SELECT coalesce(max(batch_id), 0) FROM "outbox_batch") THEN 0 ELSE low::bigint END) AND b.batch_id <> 0
	  AND NOT EXISTS (SELECT 1 FROM "outbox_batch" AS y WHERE y.batch_id = b.batch_id AND y.gen > b.gen)
	  AND b.n > (SELECT coalesce(sum(cardinality(d.seqs)), 0) FROM "outbox_settle" AS d
	             WHERE d.batch_id = b.batch_id AND d.gen = b.gen AND d.kind IN ('p', 'f'))
), inflight AS (SELECT coalesce(bool_or(u.keys IS NULL), false) AS every,
	coalesce(array_agg(DISTINCT x.k) FILTER (WHERE x.k IS NOT NULL), '{}') AS keys
	FROM u LEFT JOIN LATERAL unnest(u.keys) AS x(k) ON true)
        SELECT i.every, i.keys INTO every, held FROM inflight AS i;
        IF every THEN
            RETURN; -- a batch of the table's unordered days is unfinished
        END IF;
    END IF;
    SELECT b.batch_id, b.lo, b.hi, b.last_tx, b.last_seq, b.more INTO l
    FROM "outbox_batch" AS b ORDER BY b.batch_id DESC, b.gen DESC LIMIT 1;
    IF FOUND THEN
        bid := l.batch_id + 1;
        IF l.more THEN
            lo := l.lo; hi := l.hi; a_tx := l.last_tx; a_seq := l.last_seq; by_ord := l.last_tx = '0';
        ELSE
            lo := l.hi;
        END IF;
    END IF;
    IF hi IS NULL THEN
        hi := pg_current_snapshot();
        IF ordered THEN
            SELECT x.ordered_from INTO m FROM "outbox_log" AS x;
            IF m.ordered_from IS NOT NULL THEN
                -- What was committed before the table was made ordered
                -- and not taken yet is a window of its own, up to that
                -- snapshot, in the order of tx, seq. Once there is none,
                -- there never is again.
                IF EXISTS (SELECT 1 FROM "outbox" AS o
                           WHERE o.tx >= pg_snapshot_xmin(lo) AND o.tx < pg_snapshot_xmax(m.ordered_from)
                             AND pg_visible_in_snapshot(o.tx, m.ordered_from) AND NOT pg_visible_in_snapshot(o.tx, lo)) THEN
                    hi := m.ordered_from;
                ELSE
                    UPDATE "outbox_log" SET ordered_from = NULL;
                    m.ordered_from := NULL;
                END IF;
            END IF;
            IF m.ordered_from IS NULL THEN
                SELECT min(w.ord), bool_or(w.ord IS NULL) INTO w_min, w_nulls FROM (
                    (SELECT o.ord FROM "outbox" AS o
                     WHERE o.tx = ANY(ARRAY(SELECT pg_snapshot_xip(lo))) AND pg_visible_in_snapshot(o.tx, hi))
                    UNION ALL
                    (SELECT o.ord FROM "outbox" AS o
                     WHERE o.tx >= pg_snapshot_xmax(lo) AND o.tx < pg_snapshot_xmax(hi) AND pg_visible_in_snapshot(o.tx, hi))) AS w;
                IF w_nulls IS NULL THEN
                    RETURN; -- nothing new
                END IF;
                -- A row without ord (written by a trigger-less writer
                -- while the table was being made ordered by hand) makes
                -- the window one of tx, seq: nothing is left behind.
                IF NOT w_nulls THEN
                    by_ord := true;
                    a_seq := w_min - 1;
                END IF;
            END IF;
        END IF;
    END IF;
    IF by_ord THEN
        RETURN QUERY
        WITH f AS (
            SELECT o.* FROM "outbox" AS o
            WHERE o.ord > a_seq AND pg_visible_in_snapshot(o.tx, hi) AND NOT pg_visible_in_snapshot(o.tx, lo)
            ORDER BY o.ord LIMIT n + 1
        ), r AS (SELECT f.*, row_number() OVER (ORDER BY f.ord) AS rn,
                sum(octet_length(f.payload) + octet_length(f.headers::text)) OVER (ORDER BY f.ord) AS run,
                bool_or(f.event_key <> '' AND f.event_key = ANY(held)) OVER (ORDER BY f.ord) AS held_up
              FROM f),
        -- When the first message's key is held (a hot key with a backlog
        -- in flight), the batch takes the messages all the same and says
        -- that the held ones are blocked: they wait in the failed table,
        -- and the keys behind them pass.
        k AS (SELECT * FROM r WHERE r.rn <= n AND (r.rn = 1 OR r.run <= max_bytes)
              AND (NOT r.held_up OR (SELECT r1.held_up FROM r AS r1 WHERE r1.rn = 1))),
        last AS (SELECT k.ord FROM k ORDER BY k.ord DESC LIMIT 1),
        ins AS (
            INSERT INTO "outbox_batch" (batch_id, gen, lo, hi, after_tx, after_seq, last_tx, last_seq, n, more, token, lease_until, keys)
            SELECT bid, 0, lo, hi, '0', a_seq, '0', last.ord, (SELECT count(*) FROM k), (SELECT count(*) FROM r) > (SELECT count(*) FROM k),
                claim_token, now() + lease_us * interval '1 microsecond',
                ARRAY(SELECT DISTINCT k.event_key FROM k WHERE k.event_key <> '')
            FROM last
            RETURNING "outbox_batch".lease_until)
        SELECT bid, ins.lease_until, k.id, k.seq, k.tx, k.event_type, k.event_key, k.exchange, k.routing_key, k.payload, k.content_type,
            k.headers, k.created_at, k.ord,
            k.event_key <> '' AND (k.event_key = ANY(held) OR EXISTS (SELECT 1 FROM "outbox_failed" AS fl
                WHERE fl.event_key = k.event_key AND fl.published_at IS NULL AND fl.discarded_at IS NULL)),
            ordered
        FROM k, ins ORDER BY k.ord;
        RETURN;
    END IF;
    -- The window's transactions that were still running at lo are read
    -- apart (see logClaimWindow); when there were none, that read is not
    -- even begun.
    IF NOT EXISTS (SELECT FROM pg_snapshot_xip(lo)) THEN
        RETURN QUERY WITH w AS (
            (SELECT o.* FROM "outbox" AS o
             WHERE (o.tx, o.seq) > (greatest(a_tx, pg_snapshot_xmax(lo)), CASE WHEN a_tx >= pg_snapshot_xmax(lo) THEN a_seq ELSE -9223372036854775808 END) AND o.tx < pg_snapshot_xmax(hi) AND pg_visible_in_snapshot(o.tx, hi)
             ORDER BY o.tx, o.seq LIMIT n + 1)
        ), f AS (SELECT * FROM w ORDER BY w.tx, w.seq LIMIT n + 1),
        r AS (SELECT f.*, row_number() OVER (ORDER BY f.tx, f.seq) AS rn,
                sum(octet_length(f.payload) + octet_length(f.headers::text)) OVER (ORDER BY f.tx, f.seq) AS run,
                bool_or(ordered AND f.event_key <> '' AND f.event_key = ANY(held)) OVER (ORDER BY f.tx, f.seq) AS held_up
              FROM f),
        k AS (SELECT * FROM r WHERE r.rn <= n AND (r.rn = 1 OR r.run <= max_bytes) AND NOT r.held_up),
        last AS (SELECT k.tx, k.seq FROM k ORDER BY k.tx DESC, k.seq DESC LIMIT 1),
        ins AS (
            INSERT INTO "outbox_batch" (batch_id, gen, lo, hi, after_tx, after_seq, last_tx, last_seq, n, more, token, lease_until, keys)
            SELECT bid, 0, lo, hi, a_tx, a_seq, last.tx, last.seq, (SELECT count(*) FROM k), (SELECT count(*) FROM r) > (SELECT count(*) FROM k),
                claim_token, now() + lease_us * interval '1 microsecond',
                CASE WHEN ordered THEN ARRAY(SELECT DISTINCT k.event_key FROM k WHERE k.event_key <> '') END
            FROM last
            RETURNING "outbox_batch".lease_until)
        SELECT bid, ins.lease_until, k.id, k.seq, k.tx, k.event_type, k.event_key, k.exchange, k.routing_key, k.payload, k.content_type,
            k.headers, k.created_at, k.ord,
            ordered AND k.event_key <> '' AND EXISTS (SELECT 1 FROM "outbox_failed" AS fl
                WHERE fl.event_key = k.event_key AND fl.published_at IS NULL AND fl.discarded_at IS NULL),
            ordered
        FROM k, ins ORDER BY k.tx, k.seq;
    ELSE
        RETURN QUERY WITH w AS (
            (SELECT o.* FROM "outbox" AS o
             WHERE o.tx = ANY(ARRAY(SELECT pg_snapshot_xip(lo))) AND (o.tx, o.seq) > (a_tx, a_seq) AND pg_visible_in_snapshot(o.tx, hi)
             ORDER BY o.tx, o.seq LIMIT n + 1)
            UNION ALL
            (SELECT o.* FROM "outbox" AS o
             WHERE (o.tx, o.seq) > (greatest(a_tx, pg_snapshot_xmax(lo)), CASE WHEN a_tx >= pg_snapshot_xmax(lo) THEN a_seq ELSE -9223372036854775808 END) AND o.tx < pg_snapshot_xmax(hi) AND pg_visible_in_snapshot(o.tx, hi)
             ORDER BY o.tx, o.seq LIMIT n + 1)
        ), f AS (SELECT * FROM w ORDER BY w.tx, w.seq LIMIT n + 1),
        r AS (SELECT f.*, row_number() OVER (ORDER BY f.tx, f.seq) AS rn,
                sum(octet_length(f.payload) + octet_length(f.headers::text)) OVER (ORDER BY f.tx, f.seq) AS run,
                bool_or(ordered AND f.event_key <> '' AND f.event_key = ANY(held)) OVER (ORDER BY f.tx, f.seq) AS held_up
              FROM f),
        k AS (SELECT * FROM r WHERE r.rn <= n AND (r.rn = 1 OR r.run <= max_bytes) AND NOT r.held_up),
        last AS (SELECT k.tx, k.seq FROM k ORDER BY k.tx DESC, k.seq DESC LIMIT 1),
        ins AS (
            INSERT INTO "outbox_batch" (batch_id, gen, lo, hi, after_tx, after_seq, last_tx, last_seq, n, more, token, lease_until, keys)
            SELECT bid, 0, lo, hi, a_tx, a_seq, last.tx, last.seq, (SELECT count(*) FROM k), (SELECT count(*) FROM r) > (SELECT count(*) FROM k),
                claim_token, now() + lease_us * interval '1 microsecond',
                CASE WHEN ordered THEN ARRAY(SELECT DISTINCT k.event_key FROM k WHERE k.event_key <> '') END
            FROM last
            RETURNING "outbox_batch".lease_until)
        SELECT bid, ins.lease_until, k.id, k.seq, k.tx, k.event_type, k.event_key, k.exchange, k.routing_key, k.payload, k.content_type,
            k.headers, k.created_at, k.ord,
            ordered AND k.event_key <> '' AND EXISTS (SELECT 1 FROM "outbox_failed" AS fl
                WHERE fl.event_key = k.event_key AND fl.published_at IS NULL AND fl.discarded_at IS NULL),
            ordered
        FROM k, ins ORDER BY k.tx, k.seq;
    END IF;
END
$$;

COMMENT ON FUNCTION "outbox_claim"(integer, bigint, bigint, uuid, bigint) IS 'outbox claim revision 2';

UPDATE "outbox_log" SET version = 2 WHERE version < 2;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP VIEW IF EXISTS "outbox_messages";
DROP FUNCTION IF EXISTS "outbox_claim"(integer, bigint, bigint, uuid, bigint);
DROP TABLE IF EXISTS "outbox_failed", "outbox_settle", "outbox_batch", "outbox_log";
DROP TABLE IF EXISTS "outbox";
DROP FUNCTION IF EXISTS "outbox_id_check"();
DROP FUNCTION IF EXISTS "outbox_order"();
-- +goose StatementEnd
